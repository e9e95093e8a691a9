"""The AIMD gate driven by the real engine's /metrics under an online burst (issue 4, item 6)."""

from __future__ import annotations

import pytest

from config import load_settings
from tidal_workers.bench import gate_trace
from tidal_workers.policy.aimd import GROW
from tidal_workers.policy.aimd import HOLD

pytestmark = pytest.mark.engine

MAX_INFLIGHT = 4


def test_burst_halves_the_target_within_two_scrapes_and_it_recovers(tiny_engine):
    # The default controller (1 Hz scrapes; each scrape may take half a period), starting at its ceiling.
    settings = load_settings().replace(
        scrape_seconds=1.0,
        ewma_alpha=0.5,
        kv_high=0.85,
        kv_low=0.70,
        online_waiting_tolerance=0.0,
        min_inflight=0,
        max_inflight=MAX_INFLIGHT,
        initial_inflight=MAX_INFLIGHT,
        metrics_stale_seconds=5.0,
    )
    # 24 online requests against 8 slots: most of them wait in vLLM for a second or more, and 8 running ones
    # with ~400-token prompts overfill the 3,072-token KV pool, for 3-5 s on this machine. Recovery after the burst takes about 4 periods
    # for the waiting EWMA to decay and 4 to grow back to the ceiling: 26 s leaves room for a slow machine.
    cfg = gate_trace.GateTraceConfig(
        engine_url=tiny_engine.url,
        model=tiny_engine.model,
        duration=26.0,
        burst_at=3.5,
        burst_requests=24,
        burst_max_tokens=384,
        batch_max_tokens=64,
    )
    trace = gate_trace.run(cfg, settings)
    summary = trace.summary()
    print(f"gate trace: {summary}")

    assert summary["burst_errors"] == 0 and summary["batch_errors"] == 0, trace.batch_errors[:3]
    assert summary["batch_completed"] > 0
    before = [s for s in trace.scrapes if s.at < trace.burst_start]
    assert len(before) >= 3 and all(s.target == MAX_INFLIGHT and s.decision in (GROW, HOLD) for s in before)

    seen = trace.pressure_seen()
    assert seen is not None, "the burst never showed up in /metrics"
    assert seen.at <= trace.burst_end + settings.scrape_seconds  # the pressure was the burst's
    assert summary["scrapes_seen_to_halving"] is not None and summary["scrapes_seen_to_halving"] <= 2, summary
    assert summary["min_target_in_burst"] <= MAX_INFLIGHT // 2

    assert summary["recovered_s"] is not None, f"target never returned to {MAX_INFLIGHT} after the burst: {summary}"
    assert trace.scrapes[-1].target == MAX_INFLIGHT
