"""The instant (tidal_workers/bench/step_response.py; pure): online inflation after a step in the online rate,
against α_set, from the same trace's records co-served and alone; and the step load the frontier sends."""

from __future__ import annotations

import pytest

from tests.support.bench_helpers import frontier_plan
from tidal_workers.bench import frontier
from tidal_workers.bench import frontier_plan as fp
from tidal_workers.bench import step_response as sr
from tidal_workers.bench.workload import ONLINE_LOADS

pytestmark = pytest.mark.no_sql

STEP = 60.0


def trace(gap_at) -> list[dict]:
    """One request every 0.25 s for 120 s, 20 tokens each; each token's gap is ``gap_at(instant)``, its first token
    after 2 gaps."""
    out = []
    for i in range(480):
        at = 0.25 * i
        chunks, now = [], 2 * gap_at(at)
        for k in range(20):
            chunks.append([now, k + 1])
            now += gap_at(at + now)
        out.append({"at": at, "error": None, "chunks": chunks, "prompt_tokens": 100})
    return out


def alone_gap(_at: float) -> float:
    return 0.030


def test_an_inflation_that_settles_within_alpha_in_10_s_holds():
    def co_gap(at: float) -> float:  # 1.05× before, 1.6× for 5 s after the step, then 1.08×
        return 0.030 * (1.6 if STEP <= at < STEP + 5 else 1.08 if at >= STEP else 1.05)

    got = sr.response(trace(co_gap), trace(alone_gap), STEP, alpha_set=1.1)
    assert got.transient is not None and got.transient > 1.08  # the first 10 s hold the 5-s spike
    assert got.recovered == pytest.approx(1.08)
    assert got.holds is True
    before = [v for start, v in got.bins if start < 0]
    assert before and all(v == pytest.approx(1.05) for v in before)
    assert max(v for _, v in got.bins if v is not None) == pytest.approx(1.6)
    assert got.ttft_recovered == pytest.approx(1.08)


def test_one_still_over_alpha_10_s_after_the_step_does_not_hold_and_a_gate_ceiling_has_no_verdict():
    def co_gap(at: float) -> float:  # 1.3× for 16 s after the step
        return 0.030 * (1.3 if STEP <= at < STEP + 16 else 1.05)

    late = sr.response(trace(co_gap), trace(alone_gap), STEP, alpha_set=1.1)
    assert late.recovered is not None and late.recovered > 1.1
    assert late.holds is False
    assert sr.response(trace(co_gap), trace(alone_gap), STEP, alpha_set=None).holds is None


def test_a_failed_request_and_a_chunk_of_several_tokens_count_as_the_engine_gave_them():
    one = {"at": 1.0, "error": None, "chunks": [[0.1, 1], [0.4, 4]], "prompt_tokens": 10}  # 3 tokens over 0.3 s
    failed = {"at": 1.0, "error": "http 500", "chunks": [[0.1, 1], [0.2, 2]], "prompt_tokens": 10}
    at, gaps = sr.token_gaps([one, failed])
    assert at.tolist() == pytest.approx([1.4, 1.4, 1.4]) and gaps.tolist() == pytest.approx([0.1, 0.1, 0.1])


def test_a_step_load_runs_its_lead_in_at_the_rate_before_and_steps_60_s_into_its_window():
    plan = frontier_plan(loads=("step-1-8",), window_s=120.0)
    load = ONLINE_LOADS["step-1-8"]
    assert plan.window_for("step") == plan.longest_window_for("step") == fp.STEP_AT_S + 120.0
    made = frontier.OnlineTrace.of(plan, load, 0)
    lead_rate = len(made.lead_in) / made.lead_in[-1].at
    before = [i for i in made.measured if i.at < fp.STEP_AT_S]
    after = [i for i in made.measured if i.at >= fp.STEP_AT_S]
    assert 0.6 < lead_rate < 1.5 and 30 < len(before) < 95 and 800 < len(after) < 1120
