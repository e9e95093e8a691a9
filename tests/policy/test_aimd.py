"""The AIMD rule on scripted observations and a scripted clock."""

from __future__ import annotations

import itertools

import pytest

from config import load_settings
from tidal_workers.policy.aimd import FAILSAFE
from tidal_workers.policy.aimd import GROW
from tidal_workers.policy.aimd import HALVE
from tidal_workers.policy.aimd import HOLD
from tidal_workers.policy.aimd import AimdConfig
from tidal_workers.policy.aimd import AimdController
from tidal_workers.policy.aimd import AimdState
from tidal_workers.policy.aimd import Observation
from tidal_workers.policy.aimd import engine_ceiling

CFG = AimdConfig(kv_high=0.85, kv_low=0.70, alpha=0.5, period=1.0, min_target=0, max_target=8, initial_target=1)


def obs(kv=0.3, waiting=0, running=0, preemptions=0, inflight=None, ok=True):
    # by default the node keeps its gate full, so growth is never blocked by idleness
    return Observation(kv, waiting, running, preemptions, inflight if inflight is not None else 99, ok)


def run(ctl, script, start=None, t0=0.0, dt=1.0):
    """Feed (observation, ...) at one per ``dt``; return the states after each step."""
    state, states = start or ctl.initial(), []
    for i, o in enumerate(script):
        state = ctl.step(state, o, t0 + i * dt)
        states.append(state)
    return states


def targets(states):
    return [s.target for s in states]


def test_from_settings_reads_every_knob():
    s = load_settings(
        {},
        kv_high=0.9,
        kv_low=0.5,
        ewma_alpha=0.25,
        scrape_seconds=2.0,
        online_waiting_tolerance=3.0,
        min_inflight=1,
        max_inflight=64,
        initial_inflight=2,
    )
    assert AimdConfig.from_settings(s, 64) == AimdConfig(0.9, 0.5, 0.25, 2.0, 3.0, 1, 64, 2)
    # a start value outside the bounds is clamped into them
    assert AimdConfig.from_settings(s.replace(initial_inflight=100), 64).initial_target == 64


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="alpha"):
        AimdConfig(alpha=0)
    with pytest.raises(ValueError, match="kv_low"):
        AimdConfig(kv_low=0.9, kv_high=0.8)
    with pytest.raises(ValueError, match="min_target"):
        AimdConfig(min_target=5, max_target=4, initial_target=4)


def test_steady_growth_adds_one_per_period_up_to_max():
    states = run(AimdController(CFG), [obs(kv=0.3)] * 10)
    assert targets(states) == [2, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    assert [s.decision for s in states[-3:]] == [HOLD] * 3
    # scraped four times a period, it still grows once per period
    fast = run(AimdController(CFG), [obs(kv=0.3)] * 12, dt=0.25)
    assert targets(fast) == [2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]


def test_idle_node_does_not_balloon_its_target():
    """Growth needs the gate in use: batch_inflight >= target - 1."""
    states = run(AimdController(CFG), [obs(kv=0.0, inflight=0)] * 10)
    assert targets(states) == [2] * 10  # 1 -> 2 (0 >= 1 - 1), then 0 < 2 - 1 holds it
    busy = run(AimdController(CFG), [obs(kv=0.0, inflight=t) for t in (0, 1, 2, 3)])
    assert targets(busy) == [2, 3, 4, 5]


def test_spike_halves_once_per_period_not_once_per_scrape():
    ctl = AimdController(CFG)
    state = AimdState(target=8)
    calm = run(ctl, [obs(kv=0.75)] * 4, start=state)  # between the thresholds: hold
    assert targets(calm) == [8] * 4
    # the spike is scraped four times a period for two periods
    spike = run(ctl, [obs(kv=0.99)] * 8, start=calm[-1], t0=4.0, dt=0.25)
    # EWMA: 0.87 at the first scrape already passes 0.85 -> halve; then only once per period
    assert targets(spike) == [4, 4, 4, 4, 2, 2, 2, 2]
    assert [s.decision for s in spike].count(HALVE) == 2


def test_single_scrape_blip_is_smoothed_away():
    ctl = AimdController(CFG)
    steady = run(ctl, [obs(kv=0.6)] * 3, start=AimdState(target=8))
    blip = run(ctl, [obs(kv=0.95), obs(kv=0.6)], start=steady[-1], t0=3.0)
    assert blip[0].kv_ewma == pytest.approx(0.775)
    assert targets(blip) == [8, 8]


def test_recovery_after_a_spike():
    ctl = AimdController(CFG)
    script = [obs(kv=0.95)] * 3 + [obs(kv=0.2)] * 8
    states = run(ctl, script, start=AimdState(target=8))
    # 8 -> 4 -> 2 -> 1 under pressure; the first calm scrape already brings the EWMA under kv_low (0.575)
    assert targets(states) == [4, 2, 1, 2, 3, 4, 5, 6, 7, 8, 8]


def test_flapping_around_kv_high_only_ever_lowers_the_target():
    ctl = AimdController(CFG)
    script = [obs(kv=0.80 if i % 2 else 0.90) for i in range(12)]
    states = run(ctl, script, start=AimdState(target=8))
    ts = targets(states)
    assert all(b <= a for a, b in itertools.pairwise(ts)), ts  # never back up: the band below kv_high holds
    assert GROW not in [s.decision for s in states]


def test_flapping_around_kv_low_only_ever_raises_the_target():
    ctl = AimdController(CFG)
    script = [obs(kv=0.68 if i % 2 else 0.72) for i in range(12)]
    states = run(ctl, script, start=AimdState(target=2))
    ts = targets(states)
    assert all(b >= a for a, b in itertools.pairwise(ts)), ts
    assert HALVE not in [s.decision for s in states]
    assert ts[-1] > 2


def test_preemptions_rising_is_pressure_and_a_counter_reset_is_not():
    ctl = AimdController(CFG)
    states = run(ctl, [obs(preemptions=10), obs(preemptions=10), obs(preemptions=12)], start=AimdState(target=8))
    assert [s.decision for s in states] == [HOLD, HOLD, HALVE]  # the first reading is only a baseline
    assert states[-1].target == 4
    # the engine restarts: its counter falls to 0, then counts on from there
    after = run(ctl, [obs(preemptions=0), obs(preemptions=0), obs(preemptions=1)], start=states[-1], t0=3.0)
    assert [s.decision for s in after] == [GROW, GROW, HALVE]
    assert after[0].preemptions_seen == 0


def test_online_waiting_is_waiting_beyond_our_own_items():
    ctl = AimdController(CFG)
    start = AimdState(target=4)
    ours = run(ctl, [obs(waiting=3, inflight=4)] * 3, start=start)
    assert HALVE not in [s.decision for s in ours]  # our own 4 items can explain 3 waiting
    online = run(ctl, [obs(waiting=6, inflight=4)], start=start)
    assert online[0].decision == HALVE and online[0].waiting_ewma == 2.0


def test_waiting_ewma_decaying_toward_zero_does_not_hold_the_gate_shut():
    ctl = AimdController(CFG)
    script = [obs(waiting=8, inflight=0)] + [obs(waiting=0, inflight=t) for t in range(8)]
    states = run(ctl, script, start=AimdState(target=8))
    # EWMA of online waiting: 8, 4, 2, 1, 0.5, 0.25 ... pressure while >= 0.5 (one whole request)
    assert [s.decision for s in states] == [HALVE, HALVE, HALVE, HALVE, HALVE, GROW, GROW, GROW, GROW]
    assert targets(states) == [4, 2, 1, 0, 0, 1, 2, 3, 4]


def test_tolerance_admits_that_many_online_waiters():
    ctl = AimdController(AimdConfig(online_waiting_tolerance=2.0, max_target=8, initial_target=4))
    assert run(ctl, [obs(waiting=2, inflight=0)] * 3)[-1].decision != HALVE
    assert run(ctl, [obs(waiting=3, inflight=0)])[0].decision == HALVE


def test_failsafe_closes_at_once_and_reopens_on_good_readings():
    ctl = AimdController(CFG)
    up = run(ctl, [obs(kv=0.3)] * 5)
    assert up[-1].target == 6
    script = [obs(ok=False)] * 3 + [obs(kv=0.3)] * 4
    states = run(ctl, script, start=up[-1], t0=5.0)
    assert [s.decision for s in states] == [FAILSAFE] * 3 + [GROW] * 4
    assert targets(states) == [0, 0, 0, 1, 2, 3, 4]
    assert states[2].kv_ewma is None  # the stale smoothing is forgotten
    assert states[3].kv_ewma == 0.3  # the first good reading seeds it afresh


def test_failsafe_respects_min_target():
    ctl = AimdController(AimdConfig(min_target=2, max_target=8, initial_target=4))
    assert ctl.step(ctl.initial(), obs(ok=False), 0.0).target == 2
    assert run(ctl, [obs(kv=0.99)] * 4)[-1].target == 2  # halving stops at the floor too


def test_a_clock_stepping_back_does_not_freeze_the_controller():
    ctl = AimdController(CFG)
    state = ctl.step(AimdState(target=8), obs(kv=0.99), 1000.0)
    assert state.target == 4
    assert ctl.step(state, obs(kv=0.99), 10.0).target == 2


def test_online_waiting_is_exact_when_our_requests_all_run():
    """O = 20 of ours at the engine, all running beside 8 online ones: the one waiting request is online."""
    assert Observation(0.5, waiting=1, running=28, preemptions_total=0, batch_inflight=20).online_waiting == 1
    assert Observation(0.5, waiting=0, running=28, preemptions_total=0, batch_inflight=20).online_waiting == 0
    # 5 of ours cannot be running (only 15 run): at most 5 of the 7 waiting are ours
    assert Observation(0.5, waiting=7, running=15, preemptions_total=0, batch_inflight=20).online_waiting == 2


def test_engine_ceiling_is_the_tighter_of_slots_and_kv_less_the_online_headroom():
    assert engine_ceiling(256, 16 * 2048, 1024, 0.25) == 24  # KV fits 32 requests, the tighter bound
    assert engine_ceiling(16, 10**9, 1024, 0.25) == 12  # the slots are
    assert engine_ceiling(0, 8192, 1024, 0.5) == 4  # slots unknown: KV alone
    assert engine_ceiling(0, None, 1024, 0.25) is None  # the engine told nothing
    assert engine_ceiling(1, None, 1024, 0.9) == 1  # never below one
