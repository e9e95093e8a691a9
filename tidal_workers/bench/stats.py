"""Figures as distributions: the mean of repetitions with its 95 % Student-t interval (minimal; no SciPy here)."""

from __future__ import annotations

import math
import statistics

# Two-sided 95 % quantiles of Student's t by degrees of freedom; past 30 the normal's 1.96 is close enough.
_T95 = dict(
    enumerate(
        (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
        + (2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),
        start=1,
    )
)


def interval(samples: list[float]) -> dict[str, float | int | None]:
    """``{"mean", "lo", "hi", "n"}``: the mean and its 95 % interval (none from a single sample)."""
    n = len(samples)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    mean = statistics.fmean(samples)
    if n == 1:
        return {"mean": mean, "lo": None, "hi": None, "n": 1}
    half = _T95.get(n - 1, 1.96) * statistics.stdev(samples) / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}
