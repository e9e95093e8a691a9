"""The timed twin's step trace (``twin_model.TRACE_COLUMNS``, one CSV line per step) and a window's step figures.

Every twin a benchmark starts writes its trace (``engines.started``), so each measured window can say how well
the twin kept its profile's time: the share of its steps the twin could not slow down to T(P, C) (an overrun: the
engine's own work already took longer; the pacer then sleeps exactly 0), the mean excess of a step over its T,
and the mean host gap between steps (from one forward's end to the next one's start: scheduling, input
preparation, output processing). A window with more than ``steady.OVERRUN_MAX`` overruns measured this machine,
not the profile's GPU.

``Trace`` reads the file from a mark taken when a window opened, so a run of hours never rereads its whole trace.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing as t
from pathlib import Path

from tidal_engine.step_time import Pacer

Row = dict[str, float]
IDLE_GAP_S = Pacer.idle_gap_s  # a longer gap is the engine waiting for work, not a step's host time


def is_overrun(row: Row) -> bool:
    """The twin could not pace this step: its pacer slept exactly 0 (``Pacer.sleep_seconds``)."""
    return row["sleep_s"] == 0.0


def parse(lines: t.Iterable[str], columns: t.Sequence[str]) -> list[Row]:
    """Complete CSV lines (ending in a newline) as rows; a partial last line, still being written, is left out."""
    return [
        dict(zip(columns, map(float, line.split(",")), strict=True))
        for line in lines
        if line.endswith("\n") and line.strip()
    ]


@dataclasses.dataclass(frozen=True)
class StepStats:
    steps: int
    steps_per_s: float
    mean_step_ms: float  # start to next start
    mean_target_ms: float  # T(P, C) of the same steps
    tokens_per_step: float
    overrun_share: float
    mean_excess_ms: float  # mean over steps of max(0, step − T)
    mean_host_gap_ms: float | None  # one forward's end to the next one's start, idle waits left out
    idle_gaps: int  # gaps longer than IDLE_GAP_S: the engine waited for work

    def as_dict(self) -> dict[str, t.Any]:
        return dataclasses.asdict(self)


def window_steps(rows: t.Sequence[Row], start: float, end: float) -> StepStats | None:
    """The steps that started in [start, end], each timed to the next one's start; None without two of them."""
    ordered = sorted(rows, key=lambda r: r["started_s"])
    pairs = [(a, b) for a, b in itertools.pairwise(ordered) if start <= a["started_s"] <= end]
    if len(pairs) < 2:
        return None
    intervals = [b["started_s"] - a["started_s"] for a, b in pairs]
    gaps = [b["started_s"] - (a["started_s"] + a["forward_s"] + a["sleep_s"]) for a, b in pairs]
    working = [g for g in gaps if g <= IDLE_GAP_S]
    seconds = pairs[-1][1]["started_s"] - pairs[0][0]["started_s"]
    n = len(pairs)
    return StepStats(
        steps=n,
        steps_per_s=n / seconds if seconds > 0 else 0.0,
        mean_step_ms=1000 * sum(intervals) / n,
        mean_target_ms=1000 * sum(a["target_s"] for a, _ in pairs) / n,
        tokens_per_step=sum(a["num_tokens"] for a, _ in pairs) / n,
        overrun_share=sum(is_overrun(a) for a, _ in pairs) / n,
        mean_excess_ms=1000 * sum(max(0.0, i - a["target_s"]) for i, (a, _) in zip(intervals, pairs)) / n,
        mean_host_gap_ms=1000 * sum(working) / len(working) if working else None,
        idle_gaps=n - len(working),
    )


class Trace:
    """A twin's trace file, read from a mark onwards."""

    def __init__(self, path: Path):
        self.path = path

    def mark(self) -> int:
        """Where the file ends now: rows written from here on are a window's."""
        return self.path.stat().st_size if self.path.exists() else 0

    def rows(self, since: int = 0) -> list[Row]:
        """The rows written after ``since`` (a mark), whole lines only."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            columns = f.readline().decode().strip().split(",")
            if since > f.tell():
                f.seek(since - 1)
                if f.read(1) != b"\n":
                    f.readline()  # the mark fell inside a line: it belongs to the step before
            return parse((line.decode() for line in f), columns)

    def window(self, start: float, end: float, since: int = 0) -> StepStats | None:
        return window_steps(self.rows(since), start, end)
