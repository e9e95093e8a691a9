"""Percentile bootstrap intervals for benchmark figures (docs/benchmarks.md: every figure has a 95 % interval)."""

from __future__ import annotations

import typing as t

import numpy as np

Statistic = t.Callable[[np.ndarray], float]


def bootstrap(
    samples: t.Sequence[float], statistic: Statistic = np.median, resamples: int = 2000, seed: int = 0
) -> dict[str, float | int | None]:
    """``statistic`` of the samples with its 95 % percentile-bootstrap interval (None where there are no samples)."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        return {"value": None, "low": None, "high": None, "n": 0}
    rng = np.random.default_rng(seed)
    draws = rng.choice(values, size=(resamples, values.size), replace=True)
    stats = np.apply_along_axis(statistic, 1, draws)
    low, high = np.percentile(stats, [2.5, 97.5])
    return {"value": float(statistic(values)), "low": float(low), "high": float(high), "n": int(values.size)}
