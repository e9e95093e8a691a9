"""The twin's step trace and a window's step figures (tidal_workers/bench/step_trace.py): overrun share, excess over
T, host gap, read from a mark."""

from __future__ import annotations

import pytest

from tidal_engine.twin_model import TRACE_COLUMNS
from tidal_workers.bench import step_trace

pytestmark = pytest.mark.no_sql


def row(started: float, *, target: float = 0.030, forward: float = 0.002, sleep: float = 0.026, tokens: int = 40):
    """One step as the twin traces it: a line of ``twin_model.TRACE_COLUMNS``, every one of them (a trace written
    with them fails on one the twin has and this row lacks)."""
    return {
        "started_s": started,
        "num_tokens": tokens,
        "context": 1000,
        "pairs": 1000,
        "num_reqs": tokens,
        "target_s": target,
        "forward_s": forward,
        "outside_s": 0.002,
        "sleep_s": sleep,
        "overruns": 0.0,
    }


def paced(n: int, start: float = 100.0, step: float = 0.030) -> list[dict[str, float]]:
    """Steps of exactly their target: a forward of 2 ms, a sleep of 26 ms, a host gap of 2 ms."""
    return [row(start + i * step) for i in range(n)]


def test_paced_steps_have_no_overrun_and_no_excess():
    stats = step_trace.window_steps(paced(101), 100.0, 103.0)
    assert stats is not None
    assert stats.steps == 100
    assert stats.overrun_share == 0.0
    assert stats.mean_excess_ms == pytest.approx(0.0, abs=1e-6)
    assert stats.mean_step_ms == pytest.approx(30.0)
    assert stats.mean_target_ms == pytest.approx(30.0)
    assert stats.mean_host_gap_ms == pytest.approx(2.0)
    assert stats.tokens_per_step == 40
    assert stats.idle_gaps == 0


def test_overruns_are_the_steps_the_pacer_could_not_slow_down():
    rows, at = [], 0.0
    for i in range(20):
        late = i % 5 == 0  # one step in five: forward 40 ms over a 30 ms target, no sleep
        rows.append(row(at, forward=0.040 if late else 0.002, sleep=0.0 if late else 0.026))
        at += 0.042 if late else 0.030
    stats = step_trace.window_steps(rows, 0.0, at)
    assert stats is not None and stats.steps == 19  # the last step has no following start to time it
    assert stats.overrun_share == pytest.approx(4 / 19)
    assert stats.mean_excess_ms == pytest.approx(1000 * 4 * 0.012 / 19)


def test_idle_waits_are_not_host_time():
    rows = paced(10) + paced(10, start=200.0)  # 97 s without work between the two bursts
    stats = step_trace.window_steps(rows, 0.0, 300.0)
    assert stats is not None
    assert stats.idle_gaps == 1
    assert stats.mean_host_gap_ms == pytest.approx(2.0)


def test_only_the_window_s_steps_count():
    stats = step_trace.window_steps(paced(200), 101.005, 102.005)
    assert stats is not None and stats.steps == 33  # the steps starting at 101.02 .. 101.98
    assert step_trace.window_steps(paced(10), 500.0, 600.0) is None


def test_trace_reads_from_a_mark_whole_lines_only(tmp_path):
    path = tmp_path / "trace.csv"
    trace = step_trace.Trace(path)
    assert trace.mark() == 0 and trace.rows() == []

    def line(r: dict[str, float]) -> str:
        return ",".join(str(r[c]) for c in TRACE_COLUMNS) + "\n"

    rows = paced(6)
    path.write_text(",".join(TRACE_COLUMNS) + "\n" + "".join(line(r) for r in rows[:3]))
    mark = trace.mark()
    with path.open("a") as f:
        f.write("".join(line(r) for r in rows[3:]) + "100.9,4")  # a line still being written
    assert [r["started_s"] for r in trace.rows()] == [r["started_s"] for r in rows]
    assert [r["started_s"] for r in trace.rows(mark)] == [r["started_s"] for r in rows[3:]]
    assert [r["started_s"] for r in trace.rows(mark - 3)] == [r["started_s"] for r in rows[3:]]  # inside a line
