"""`tidal bench twin`'s reading of the step trace: which steps a cell samples, and what it reports of them."""

from __future__ import annotations

import pytest

from tidal_engine.twin import load_profile
from tidal_workers.bench.twin import Cell
from tidal_workers.bench.twin import cell_samples
from tidal_workers.bench.twin import summarize_cell


def row(started, tokens, context, reqs, target=0.03, forward=0.002, outside=0.003, sleep=0.02):
    return {
        "started_s": started,
        "num_tokens": tokens,
        "context": context,
        "num_reqs": reqs,
        "target_s": target,
        "forward_s": forward,
        "outside_s": outside,
        "sleep_s": sleep,
    }


def test_a_prefill_cell_samples_its_chunk_followed_by_the_decode_step():
    rows = [
        row(10.0, 2048, 0, 1, target=0.30),  # first chunk of a 4,096-token prompt
        row(10.3, 2048, 2048, 1, target=0.32),  # the cell's step
        row(10.63, 1, 4096, 1),  # its decode step follows at once
        row(11.5, 2048, 0, 1, target=0.30),  # the next request, after the client's round trip
        row(11.8, 2048, 2048, 1, target=0.32, sleep=0.0),  # overran its target; last in the window
    ]
    samples = cell_samples(rows, 10.0, 12.0, Cell("prefill", 2048, 2048))
    assert len(samples) == 1  # the last one has no following step to end its interval
    assert samples[0].interval_s == pytest.approx(0.33) and samples[0].target_s == 0.32
    assert samples[0].floor_s == pytest.approx(0.005) and not samples[0].overrun


def test_a_decode_cell_samples_only_steps_where_all_its_requests_decode():
    rows = [row(1.0, 2048, 0, 3), row(1.3, 514, 1024, 3), row(1.4, 2, 2048, 2)]
    rows += [row(1.5 + 0.03 * k, 2, 1030 + 2 * k, 2, sleep=0.0 if k == 1 else 0.02) for k in range(4)]
    samples = cell_samples(rows, 0.0, 5.0, Cell("decode", 2, 1024))
    assert [round(s.interval_s, 3) for s in samples] == [0.1, 0.03, 0.03, 0.03]
    assert [s.overrun for s in samples] == [False, False, True, False]
    outside_window = cell_samples(rows, 1.45, 5.0, Cell("decode", 2, 1024))
    assert len(outside_window) == 3


def test_the_summary_reports_the_p50_ratio_with_an_interval_and_attainability():
    cell = Cell("decode", 1, 512)
    steps = [row(float(k) * 0.025, 1, 512 + k, 1, target=0.025, forward=0.001, outside=0.004) for k in range(41)]
    reps = [cell_samples(steps, 0.0, 10.0, cell)] * 3
    summary = summarize_cell(cell, reps, [load_profile("qwen2.5-7b@a6000"), load_profile("qwen2.5-7b@h200")])
    ratio = summary["interval_over_target_p50"]
    assert ratio["value"] == pytest.approx(1.0) and ratio["reps"] == 3 and summary["steps"] == 120
    assert ratio["low"] == pytest.approx(1.0) and ratio["high"] == pytest.approx(1.0)  # every step on time
    assert "refused" in summarize_cell(cell, reps[:2], [])["interval_over_target_p50"]  # under 3 repetitions
    assert summary["within_tolerance"] and summary["overrun_fraction"] == 0.0
    assert summary["floor_s_p90"] == pytest.approx(0.005)
    # A 5 ms floor: the A6000's 24.7 ms decode step is attainable here, and so is the H200's 6.7 ms.
    assert summary["attainable"]["qwen2.5-7b@a6000"]["attainable"]
    assert summary["attainable"]["qwen2.5-7b@h200"]["T_s"] == pytest.approx(0.00669, abs=1e-4)
    assert len(summary["raw"]) == 3
