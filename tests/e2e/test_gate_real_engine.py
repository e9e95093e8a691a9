"""The AIMD gate driven by the real engine's /metrics under an online burst (issue 4, item 6).

The test drives the gate itself, one poll per scrape on a clock it advances by one period per poll (the
controller's time), so it counts scrapes, not seconds: nothing depends on how fast a loaded machine runs. A
backlog of batch requests (priority 100) is kept in flight at the gate's target, as the claim loop would; the
burst is online requests (priority 0) the test sends straight to vLLM, and the test waits until /metrics shows
them waiting before it counts scrapes. The gate's scrape timeout is half a period of real time (5 s here), so a
slow /metrics on a busy machine is still a reading, not a failsafe.

The engine is the timed twin (A6000 profile, 8 slots): its steps take the GPU's time whatever this machine's load,
so the burst stands in the queue for seconds. On the tiny CPU engine an idle machine served the burst faster than
it queued, and the test never saw it waiting (a clean-clone run, 1 December).

This replaces a trace on the wall clock (1 Hz scrapes, a burst at 3.5 s) that failed on a clean machine when the
burst had not reached /metrics by the time it looked. The wall-clock trace is `tidal bench gate`.
"""

from __future__ import annotations

import os
import threading

import pytest

from config import load_settings
from tests.e2e.conftest import TWIN_PROFILE
from tests.support.engine_readings import reading_when
from tests.support.wait import wait_for
from tidal_engine.step_time import decode_seconds
from tidal_engine.twin import load_profile
from tidal_workers.bench import gate_trace
from tidal_workers.gate import AimdGate
from tidal_workers.gate import FixedGate
from tidal_workers.policy.aimd import FAILSAFE
from tidal_workers.policy.aimd import GROW
from tidal_workers.policy.aimd import HALVE
from tidal_workers.policy.aimd import HOLD

pytestmark = pytest.mark.engine

MAX_INFLIGHT = 4
PERIOD = 10.0  # seconds of the gate's clock per poll; its scrape timeout is half of that, in real time
# 24 online requests against 8 slots: 16 or more of them wait in vLLM for seconds.
BURST_REQUESTS, BURST_MAX_TOKENS = 24, 384
BURST_VISIBLE = 8  # waiting requests beyond the batch backlog's that show the burst is in the engine's queue
RECOVERY_SCRAPES = 30  # the EWMAs decay in about 6 scrapes, then the target grows back one per scrape


def gate_settings(url: str, **changes: object):
    """The gate on the twin: one poll per PERIOD of its clock, starting full at MAX_INFLIGHT."""
    return load_settings().replace(
        vllm_url=url,
        scrape_seconds=PERIOD,
        min_inflight=0,
        max_inflight=MAX_INFLIGHT,
        initial_inflight=MAX_INFLIGHT,
        metrics_stale_seconds=3 * PERIOD,
        **changes,
    )


@pytest.mark.timeout(900)  # generous event deadlines (4 min each) on a busy machine; idle, the test takes ~30 s
def test_burst_halves_the_target_within_two_scrapes_and_it_recovers(twin):
    settings = gate_settings(
        twin.url, ewma_alpha=0.5, kv_high=0.85, kv_low=0.70, online_waiting_tolerance=0.0, gate_mode="aimd"
    )
    reading_when(twin.url, lambda r: r.running == r.waiting == 0, 120, "an idle engine")
    gate = AimdGate(settings)
    backlog_gate = FixedGate(MAX_INFLIGHT)
    scrapes: list[tuple[int, str]] = []  # (target, decision) per scrape

    with gate_trace.Trickle(twin.url, twin.model, backlog_gate, max_tokens=64) as backlog:

        def scrape() -> tuple[int, str]:
            """One poll of the gate at the next period of its clock; the backlog follows its target."""
            backlog_gate.target = gate.poll(len(scrapes) * PERIOD, backlog.inflight)
            scrapes.append((gate.state.target, gate.state.decision))
            return scrapes[-1]

        def wait_backlog(timeout: float = 120.0) -> None:
            """Until the backlog fills the target (the gate grows only while it is in use)."""
            wait_for(
                lambda: backlog.inflight >= backlog_gate.target - 1,
                timeout,
                lambda: f"the backlog to fill the target: {backlog.inflight} in flight, target {backlog_gate.target}",
                every=0.01,
            )

        # The first chat requests of a fresh server can take minutes to reach the engine on a busy machine (the API
        # server renders its first template): wait until the backlog runs there, so the burst takes a warm path.
        reading_when(twin.url, lambda r: r.running >= 1, 240, "the batch backlog running")
        for _ in range(3):
            wait_backlog()
            target, decision = scrape()
            assert target == MAX_INFLIGHT and decision in (GROW, HOLD), (scrapes, gate.state)

        answered: list[gate_trace.BurstRequest] = []
        burst = threading.Thread(
            daemon=True,  # a failed assertion below must not leave the session waiting on the burst's requests
            target=lambda: answered.extend(
                gate_trace.burst(twin.url, twin.model, BURST_REQUESTS, gate_trace.BURST_PROMPT, BURST_MAX_TOKENS, 0.0)
            ),
        )
        burst.start()
        seen = reading_when(
            twin.url,
            lambda r: r.waiting - backlog.inflight >= BURST_VISIBLE,
            240,
            f"{BURST_VISIBLE} online requests waiting",
        )
        before_burst = len(scrapes)
        for _ in range(2):
            if scrape()[1] == HALVE:
                break
        assert HALVE in (d for _, d in scrapes[before_burst:]), (
            f"the gate did not halve within 2 scrapes of the burst showing in /metrics ({seen}); "
            f"scrapes {scrapes[before_burst:]}, state {gate.state}, load average {os.getloadavg()}"
        )
        assert gate.state.target <= MAX_INFLIGHT // 2

        burst.join(240)
        assert not burst.is_alive() and len(answered) == BURST_REQUESTS
        assert not [b.error for b in answered if b.error], [b.error for b in answered if b.error][:3]
        after_burst = len(scrapes)
        while gate.state.target < MAX_INFLIGHT:
            assert len(scrapes) - after_burst < RECOVERY_SCRAPES, (
                f"target not back to {MAX_INFLIGHT} within {RECOVERY_SCRAPES} scrapes after the burst: "
                f"{scrapes[after_burst:]}, state {gate.state}"
            )
            wait_backlog()
            scrape()
    print(f"gate scrapes (target, decision): {scrapes}")
    assert not backlog.errors, backlog.errors[:3]
    assert backlog.completed > 0


@pytest.mark.timeout(600)
def test_the_latency_gate_reads_the_engines_inter_token_latency(twin):
    """TIDAL_GATE_MODE=latency on the twin: the mean inter-token latency the gate reads between scrapes (vLLM's
    ``vllm:inter_token_latency_seconds``) is the profile's decode step, name and unit alike. With that step as the
    reference, the batch's four requests show an inflation of order 1 (the host's gaps between steps on a loaded
    machine add some)."""
    reference = decode_seconds(load_profile(TWIN_PROFILE), MAX_INFLIGHT, 100)
    settings = gate_settings(twin.url, gate_mode="latency", gate_reference_itl_ms=1000 * reference)
    reading_when(twin.url, lambda r: r.running == r.waiting == 0, 120, "an idle engine")
    gate = AimdGate(settings)
    backlog_gate = FixedGate(MAX_INFLIGHT)
    readings: list[tuple[float | None, str]] = []
    with gate_trace.Trickle(twin.url, twin.model, backlog_gate, max_tokens=64) as backlog:
        reading_when(twin.url, lambda r: r.running >= 1, 240, "the batch backlog running")
        for i in range(4):
            gate.poll(i * PERIOD, backlog.inflight)
            readings.append((gate.state.inflation, gate.state.decision))
            done = backlog.completed + 2  # tokens between this scrape and the next
            wait_for(lambda done=done: backlog.completed >= done, 120, lambda: "batch requests completing", every=0.1)
    assert FAILSAFE not in (d for _, d in readings), readings
    inflation = gate.state.inflation
    # The unit, not the speed: read in ms, or per request instead of per token, it would be off by 1,000 or by
    # the batch's size; a loaded host's gaps between steps move it by far less than that.
    assert inflation is not None and 0.2 <= inflation <= 5.0, (readings, reference)
