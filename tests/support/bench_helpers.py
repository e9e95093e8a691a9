"""Helpers of the benchmark tests: a frontier plan as `tidal bench frontier --quick` makes it, or changed, and a
frontier point's record as frontier.py writes it."""

from __future__ import annotations

import dataclasses

from tidal_workers.bench import frontier_plan as fp
from tidal_workers.bench import frontier_report as fr
from tidal_workers.bench import samples

STEADY = fr.steady_ratio("standard")


def frontier_plan(**changes) -> fp.FrontierPlan:
    """The quick plan on one profile and load (the default techniques, each at its quick knobs), with ``changes``."""
    base = fp.FrontierPlan(
        profile="qwen2.5-7b@a6000",
        loads=("flat-8",),
        mixes=("standard",),
        techniques=fp.DEFAULT_TECHNIQUES,
        knobs={tech: fp.QUICK_KNOBS[tech] for tech in fp.DEFAULT_TECHNIQUES},
        gate_ceiling=185,
        reps=1,
        window_s=120.0,
        diurnal_window_s=600.0,
        settle_max_s=180.0,
        hold_s=20.0,
        baseline_lead_s=20.0,
        ceiling=True,
    )
    return dataclasses.replace(base, **changes)


def online_records(slow: float, n: int = 300) -> list[dict]:
    """``n`` requests, TTFT 0.1 s and a token every 30 ms, ``slow`` times slower; a spread so percentiles differ."""
    out = []
    for i in range(n):
        ttft, gap = slow * (0.1 + 0.0005 * i), slow * (0.03 + 0.00002 * i)
        out.append(
            {
                "at": i * 0.125,
                "late": 0.0,
                "error": None,
                "prompt_tokens": 300,
                "chunks": [[ttft + k * gap, k + 1] for k in range(20)],
            }
        )
    return out


def record(
    point: fp.Point,
    *,
    tokens_per_s: float = 400.0,
    ratio: float = STEADY,
    completions_per_s: float = 2.0,
    level: float = 40.0,
    slow: float = 1.3,
    settled: bool = True,
    overruns: float = 0.01,
    wall: float = 1.0,
) -> dict:
    """A point's record as frontier.py writes it: 160 s of samples, the window 20-140 s; every online latency
    ``wall`` times as long (a run at that time scale)."""
    rows = [[float(i), level, completions_per_s * i, ratio * tokens_per_s * i, tokens_per_s * i] for i in range(161)]
    out = {
        "point": point.as_dict(),
        "samples": rows,
        "window": {
            "opens": 20.0,
            "closes": 140.0,
            "settle_s": 60.0,
            "admission": {"settled": settled, "level": level, "since": 0.0, "turnover": 50.0},
        },
        "steps": {"overrun_share": overruns},
        "knob": {},
    }
    if point.kind != fp.CEILING:
        records = online_records(wall * (1.0 if point.kind == fp.ONLINE_ALONE else slow))
        out["online"] = {"summary": samples.summary(records), "records": records}
    if point.kind == fp.COSERVED:
        out["backlog_submitted"] = 5000
    return out


def point(kind: str, rep: int = 0, knob: float = 8) -> fp.Point:
    """A point of the standard mix at flat 8/s (the outside gate's, for a co-served one)."""
    if kind == fp.CEILING:
        return fp.Point(kind, "standard", 0)
    if kind == fp.ONLINE_ALONE:
        return fp.Point(kind, "standard", rep, "flat-8")
    return fp.Point(kind, "standard", rep, "flat-8", "outside", knob)
