"""The latency gate's rule (tidal_workers/policy/inflation.py and aimd.py's latency mode), on a scripted engine."""

from __future__ import annotations

import random
import statistics

import pytest

from config import load_settings
from tidal_workers.policy import inflation
from tidal_workers.policy.aimd import CUT
from tidal_workers.policy.aimd import GROW
from tidal_workers.policy.aimd import HALVE
from tidal_workers.policy.aimd import AimdConfig
from tidal_workers.policy.aimd import AimdController
from tidal_workers.policy.aimd import AimdState
from tidal_workers.policy.aimd import Observation
from tidal_workers.policy.inflation import ItlFit

pytestmark = pytest.mark.no_sql

REF, SLOPE = 0.026, 0.0003  # s: the A6000 twin's decode step with online work alone; s per batch request decoding
PER_ONLINE, ONLINE = 0.0005, 8  # s per online request running; the online requests running unless a test says
BASE = REF - PER_ONLINE * ONLINE  # the step with nothing running
ALPHA = 1.18
BUDGET = (ALPHA - 1) * REF / SLOPE  # 15.6 batch requests: where ITL is ALPHA × REF


def engine_itl(working_set: float, online: float = ONLINE) -> float:
    return BASE + PER_ONLINE * online + SLOPE * working_set


def config(**kw) -> AimdConfig:
    base = {"period": 1.0, "min_target": 0, "max_target": 185, "initial_target": 1, "alpha_set": ALPHA}
    return AimdConfig(**{**base, **kw})


def reading(
    working_set: int, itl: float | None, *, online: float = ONLINE, kv=0.3, waiting=0.0, preemptions=0.0
) -> Observation:
    return Observation(kv, waiting, working_set + online, preemptions, working_set, itl_seconds=itl)


def closed_loop(ctl: AimdController, periods: int, noise: float = 0.0, waiting: float = 0.0) -> list[AimdState]:
    """The engine holds what the target allows by the next reading; its ITL is the model's, times a noise factor."""
    rng = random.Random(1)
    state, states = ctl.initial(), []
    for i in range(periods):
        o = state.target
        itl = engine_itl(o) * (1 + rng.uniform(-noise, noise))
        state = ctl.step(state, reading(o, itl, waiting=waiting), float(i))
        states.append(state)
    return states


def test_the_fit_extends_the_line_in_the_working_set_to_the_online_alone_reference():
    fit = ItlFit()
    for o in (10, 30, 20, 40, 25):
        fit = fit.add(o, engine_itl(o))
    assert fit.reference() == pytest.approx(REF)


def test_the_fit_says_nothing_without_spread_or_without_a_rising_line():
    flat = ItlFit()
    for _ in range(50):
        flat = flat.add(20, engine_itl(20))
    assert flat.reference() is None  # O never moved: no line to extend to zero
    falling = ItlFit()
    for o in (5, 10, 15, 20):
        falling = falling.add(o, 0.05 - 0.001 * o)
    assert falling.reference() is None


def test_budget_working_set_reads_the_slope_off_the_point():
    # 40 batch requests at 1.46×: each adds 1.15 %, so 1.18× allows 15.6 of them
    at_40 = engine_itl(40) / REF
    assert inflation.budget_working_set(40, at_40, ALPHA) == pytest.approx(BUDGET)
    assert inflation.budget_working_set(40, 1.0, ALPHA) == float("inf")


def test_over_the_budget_the_target_drops_to_it_at_once_but_never_below_half():
    assert inflation.next_target(40, 40, engine_itl(40) / REF, ALPHA, 0, 185) == 20  # O* 15.6, but at most halved
    assert inflation.next_target(20, 20, engine_itl(20) / REF, ALPHA, 0, 185) == 15
    assert inflation.next_target(16, 16, ALPHA + 0.001, ALPHA, 0, 185) == 15  # over by a hair: one less
    assert inflation.next_target(0, 0, 2.0, ALPHA, 0, 185) == 0


def test_under_the_budget_the_target_climbs_by_half_the_gap_only_while_in_use():
    assert inflation.next_target(8, 8, engine_itl(8) / REF, ALPHA, 0, 185) == 11  # gap 7.6: +3
    assert inflation.next_target(4, 4, engine_itl(4) / REF, ALPHA, 0, 185) == 6  # gap 11.6, but half again at most
    assert inflation.next_target(15, 15, engine_itl(15) / REF, ALPHA, 0, 185) == 15  # within one: holds
    assert inflation.next_target(14, 14, engine_itl(14) / REF, ALPHA, 0, 185) == 15  # gap 1.6: at least one
    assert inflation.next_target(10, 3, engine_itl(3) / REF, ALPHA, 0, 185) == 10  # the engine holds 3 of 10
    assert inflation.next_target(180, 180, 1.0, ALPHA, 0, 185) == 185  # no cost seen: up to the ceiling


def lagged_loop(ctl: AimdController, periods: int, seed: int) -> list[int]:
    """A closer engine than ``closed_loop``'s: an admitted request decodes (and costs ITL) only two periods later, as
    a staged prompt's warm-ups come first; requests end after ~10 periods; a period's mean ITL swings ±15 % with the
    prefills in it. Returns the batch requests decoding, period by period."""
    rng = random.Random(seed)
    state, requests, held = ctl.initial(), [], []
    for i in range(periods):
        requests += [[2, max(1, round(rng.expovariate(0.1)))] for _ in range(state.target - len(requests))]
        decoding = sum(1 for warm, _ in requests if warm <= 0)
        itl = engine_itl(decoding) * (1 + rng.uniform(-0.15, 0.15))
        state = ctl.step(state, reading(len(requests), itl), float(i))
        held.append(decoding)
        for r in requests:
            r[0 if r[0] > 0 else 1] -= 1
        requests = [r for r in requests if r[1] > 0]
    return held


SPREAD = 0.24  # the working set's standard deviation over its mean, at the budget, on ``lagged_loop``


def test_growth_waits_for_the_smoothed_working_set_so_the_target_does_not_saw():
    """Growing half again each period on a smoothed inflation that still describes the working set of periods ago
    overshoots, then cuts: the twin's target sawed 3 <-> 15 at 5/s (docs/results/2026-12-06-latency-gate-staged)."""
    assert inflation.next_target(10, 8.5, 1.0, ALPHA, 0, 185) == 10  # the engine has not held the last growth yet
    assert inflation.next_target(10, 9.0, 1.0, ALPHA, 0, 185) == 15
    spreads = []
    for seed in range(6):
        settled = lagged_loop(AimdController(config(reference_itl_s=REF)), 400, seed)[100:]
        mean = statistics.fmean(settled)
        assert abs(mean - BUDGET) <= 0.15 * BUDGET, mean
        spreads.append(statistics.pstdev(settled) / mean)
    assert sum(spreads) / len(spreads) <= SPREAD, spreads  # growing on the raw working set: 0.28


def test_with_a_known_reference_the_gate_settles_at_the_budget_in_half_a_minute():
    states = closed_loop(AimdController(config(reference_itl_s=REF)), 60, noise=0.02)
    settled = [s.target for s in states[35:]]
    assert all(abs(x - BUDGET) <= 3 for x in settled), settled
    assert states[-1].reference_s == REF
    assert states[-1].inflation == pytest.approx(ALPHA, abs=0.05)


def test_with_the_reference_fitted_the_gate_finds_it_and_settles_at_the_budget():
    states = closed_loop(AimdController(config()), 60, noise=0.02)
    assert states[0].reference_s is None and states[0].decision == GROW  # unknown at first: the KV rule's +1
    assert states[-1].reference_s == pytest.approx(REF, rel=0.15)
    settled = [s.target for s in states[40:]]
    assert all(abs(x - BUDGET) <= 4 for x in settled), settled


def test_after_a_step_of_the_online_load_the_budget_holds_within_seconds():
    """Issue 36 item 3 on the rule alone: online running goes from ~8 (varying, as arrivals do) to ~40. The fitted
    reference lags the step (forgetting), so the online load's own cost first reads as the batch's: the gate cuts,
    and online ITL is back within α_set of its new online-alone value in a few periods even though admitted
    requests drain two a period."""
    ctl = AimdController(config())
    rng = random.Random(4)
    low = [ONLINE + rng.randint(-3, 3) for _ in range(80)]
    state, working_set = ctl.initial(), 1
    for i, n in enumerate([*low, *[40 + rng.randint(-3, 3) for _ in range(30)]]):
        itl = engine_itl(working_set, n)
        state = ctl.step(state, reading(working_set, itl, online=n), float(i))
        if i == 79:
            before = state.target
        if i == 90:  # 10 periods (seconds) after the step
            assert itl / (BASE + PER_ONLINE * n) <= ALPHA + 0.02
            assert state.target < before  # the safe side of the lag: the batch gave way
        working_set = state.target if state.target > working_set else max(state.target, working_set - 2)


def test_a_cut_that_the_engine_has_not_yet_drained_is_not_cut_again():
    """Requests already admitted finish at their own pace (two a period here): the excess they cause is the old
    target's, not the new one's."""
    ctl = AimdController(config(reference_itl_s=REF))
    state, working_set, seen = AimdState(target=60), 60, []
    for i in range(60):
        state = ctl.step(state, reading(working_set, engine_itl(working_set)), float(i))
        working_set = state.target if state.target > working_set else max(state.target, working_set - 2)
        seen.append(state.target)
    assert min(seen) >= BUDGET - 3, seen  # no undershoot while 60 drain to 16
    assert abs(seen[-1] - BUDGET) <= 1
    assert inflation.next_target(20, 40, engine_itl(40) / REF, ALPHA, 0, 185) == 15  # O* below the target: cut
    assert inflation.next_target(15, 40, engine_itl(40) / REF, ALPHA, 0, 185) == 15  # at O*, draining: hold


def test_online_waiting_is_not_a_cut_but_kv_pressure_and_preemptions_halve():
    states = closed_loop(AimdController(config(reference_itl_s=REF)), 30, waiting=3.0)
    assert abs(states[-1].target - BUDGET) <= 2  # an open-loop stream's waiting: the target holds at the budget
    ctl = AimdController(config(reference_itl_s=REF))
    at_budget = AimdState(target=16)
    assert ctl.step(at_budget, reading(16, engine_itl(16), kv=0.99), 0.0).decision == HALVE
    primed = ctl.step(at_budget, reading(16, engine_itl(16), preemptions=1.0), 0.0)
    assert ctl.step(primed, reading(16, engine_itl(16), preemptions=2.0), 1.0).decision == HALVE


def test_a_burst_of_online_work_cuts_the_target_within_a_period():
    ctl = AimdController(config(reference_itl_s=REF))
    state = AimdState(target=16, inflation=1.18, working_ewma=16.0)
    state = ctl.step(state, reading(16, 1.6 * REF), 0.0)  # online prompts lengthen every step by 60 %
    assert state.decision == CUT and state.target < 16


def test_no_token_in_a_period_leaves_the_inflation_where_it_was():
    ctl = AimdController(config(reference_itl_s=REF))
    state = AimdState(target=8, inflation=1.05, working_ewma=8.0)
    assert ctl.step(state, reading(8, None), 0.0).inflation == 1.05


def test_latency_mode_from_settings():
    s = load_settings({}, gate_mode="latency", gate_alpha_set=1.1, gate_reference_itl_ms=26.0)
    cfg = AimdConfig.from_settings(s, 64)
    assert (cfg.alpha_set, cfg.reference_itl_s) == (1.1, 0.026)
    assert AimdConfig.from_settings(s.replace(gate_mode="aimd"), 64).alpha_set is None
    with pytest.raises(ValueError, match="alpha_set"):
        AimdConfig(alpha_set=1.0)


def test_a_reference_once_fitted_outlives_a_working_set_that_holds_still():
    """At the budget the working set barely moves, and the fit's spread decays with forgetting; the gate keeps the
    reference it had rather than fall back to growing one a period."""
    ctl = AimdController(config())
    state = closed_loop(ctl, 40)[-1]
    assert state.reference_s is not None
    for i in range(600):  # ten minutes at one working set
        state = ctl.step(state, reading(state.target, engine_itl(state.target)), 40.0 + i)
    assert state.fit.reference() is None  # the fit alone has lost its spread
    assert state.reference_s == pytest.approx(REF, rel=0.05) and abs(state.target - BUDGET) <= 2


def test_online_requests_running_that_follow_the_latency_do_not_hide_the_batchs_cost():
    """By Little's law the online requests running grow with the step time the batch causes (here with one
    period's lag and arrival noise). A fit that took them as a regressor read the batch's own cost as online
    load: the reference swung with ITL itself (17-55 ms on the twin at 8/s, online alone 41 ms) and the gate saw
    little inflation. Fitted on the working set alone, the line extends to the online-alone reference."""
    ctl = AimdController(config())
    rng = random.Random(5)
    state, itl, seen = ctl.initial(), REF, []
    for i in range(120):
        online = ONLINE * itl / REF + rng.gauss(0, 1.5)
        itl = (BASE + PER_ONLINE * online + SLOPE * state.target) * (1 + rng.uniform(-0.02, 0.02))
        state = ctl.step(state, reading(state.target, itl, online=online), float(i))
        seen.append(state.reference_s)
    late = [r for r in seen[60:] if r is not None]
    assert len(late) == 60 and all(r == pytest.approx(REF, rel=0.1) for r in late), late
    assert state.inflation == pytest.approx(ALPHA, abs=0.06)
