"""The statistics every benchmark figure goes through: repetitions in ABBA order, a 95 % bootstrap interval over
them, and the rule that a ratio whose interval spans 1.0 is "no measurable change".

Pure (no I/O), so the rules are unit-tested apart from any engine. For figures the unit of resampling is the
repetition: one figure per repetition (a harvest share, a percentile ratio), the repetitions resampled with
replacement; within-repetition sampling error (a p99 over 1,000 samples) shows up as spread between
repetitions. ``paired_quantile_ratios`` resamples requests instead, for one window whose online requests are the
same trace as its baseline's (the frontier's inflation figures): each request carries all its samples (its TTFT, or
all its gaps between tokens), so the interval keeps the correlation within a request.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import typing as t

import numpy as np

MIN_REPS = 3  # fewer repetitions than this give no interval worth printing
CONFIDENCE = 0.95
RESAMPLES = 10_000
NO_CHANGE = "no measurable change"
EPSILON = 1e-9


class TooFewRepetitions(ValueError):
    """A figure was asked of fewer than MIN_REPS repetitions: the report prints the refusal, never the number."""


@dataclasses.dataclass(frozen=True)
class Interval:
    """A figure (the mean over repetitions) and its bootstrap interval."""

    value: float
    low: float
    high: float
    reps: int

    def spans(self, x: float) -> bool:
        """Whether ``x`` lies in the interval (edges within float rounding count: a mean of equal values)."""
        return self.low - EPSILON <= x <= self.high + EPSILON

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def abba_order(techniques: t.Sequence[str], reps: int) -> list[tuple[int, str]]:
    """(repetition, technique) in the order to run them: A B, B A, A B, … so that drift in the machine's load
    (or the engine warming) falls on both techniques alike instead of always on the second."""
    out = []
    for rep in range(reps):
        order = list(techniques) if rep % 2 == 0 else list(reversed(techniques))
        out += [(rep, name) for name in order]
    return out


def bootstrap(
    values: t.Sequence[float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Mean of ``values`` (one per repetition) with a percentile-bootstrap interval; refuses under MIN_REPS."""
    if len(values) < MIN_REPS:
        raise TooFewRepetitions(f"{len(values)} repetition(s); a figure needs at least {MIN_REPS}")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(statistics.fmean(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = means[int(tail * (resamples - 1))]
    high = means[round((1 - tail) * (resamples - 1))]
    return Interval(statistics.fmean(values), low, high, n)


def ratio_of_means(
    base: t.Sequence[float], arm: t.Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """mean(``arm``) ÷ mean(``base``), one value per repetition in each, with a percentile-bootstrap interval: each arm's
    repetitions resampled on their own (two code versions run as whole commands, ABBA, are not paired repetition by
    repetition). ``reps`` is the smaller arm's count; refuses under MIN_REPS in either."""
    if min(len(base), len(arm)) < MIN_REPS:
        raise TooFewRepetitions(f"{min(len(base), len(arm))} repetition(s); a ratio needs at least {MIN_REPS} per arm")
    rng = np.random.default_rng(seed)
    b, a = np.asarray(base, float), np.asarray(arm, float)
    ratios = np.sort(
        a[rng.integers(0, len(a), (resamples, len(a)))].mean(axis=1)
        / b[rng.integers(0, len(b), (resamples, len(b)))].mean(axis=1)
    )
    tail = (1 - CONFIDENCE) / 2
    low, high = ratios[int(tail * (resamples - 1))], ratios[round((1 - tail) * (resamples - 1))]
    return Interval(float(a.mean() / b.mean()), float(low), float(high), min(len(a), len(b)))


def ratio_text(interval: Interval) -> str:
    """A ratio as the report prints it: "no measurable change" when its interval spans 1.0, never a direction."""
    if interval.spans(1.0):
        return f"{NO_CHANGE} ({interval.value:.2f}× [{interval.low:.2f}, {interval.high:.2f}])"
    return f"{interval.value:.2f}× [{interval.low:.2f}, {interval.high:.2f}]"


def figure_text(values: t.Sequence[float], fmt: t.Callable[[Interval], str]) -> str:
    """The printed figure, or the refusal when there are too few repetitions to give it an interval."""
    try:
        return fmt(bootstrap(values))
    except TooFewRepetitions as exc:
        return f"refused: {exc}"


def percentile(values: t.Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile ``q`` in [0, 1]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# Student's t at 97.5 % for 1…30 degrees of freedom; past 30 the normal's 1.96 is within 2 % of it.
T_975: tuple[float, ...] = (
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131),
    *(2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),
)


def t_interval(values: t.Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean's 95 % Student-t interval, from at least two values."""
    n = len(values)
    half = (T_975[n - 2] if n - 1 <= len(T_975) else 1.96) * statistics.stdev(values) / n**0.5
    mean = statistics.fmean(values)
    return mean, mean - half, mean + half


def t_bounds(values: t.Sequence[float]) -> dict[str, float | None]:
    """The mean's 95 % Student-t interval as ``t_low`` / ``t_high`` (None under MIN_REPS). At three repetitions a
    bootstrap of the mean cannot reach past the extreme repetition; the t interval is the wider, honest one."""
    if len(values) < MIN_REPS:
        return {"t_low": None, "t_high": None}
    _, low, high = t_interval(values)
    return {"t_low": low, "t_high": high}


def interval(values: t.Sequence[float]) -> dict[str, float | int | None]:
    """A figure for the JSON: the mean with its bootstrap interval, or, under MIN_REPS, the mean alone."""
    if len(values) >= MIN_REPS:
        return {**bootstrap(values).as_dict()}
    return {"value": statistics.fmean(values) if values else None, "low": None, "high": None, "reps": len(values)}


def paired_quantile_ratios(
    base: t.Sequence[t.Sequence[float]],
    co: t.Sequence[t.Sequence[float]],
    quantiles: t.Sequence[float],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> list[Interval | None]:
    """Per quantile: quantile of ``co``'s samples ÷ the same of ``base``'s, with a 95 % interval from resampling
    the requests (request i of each is the same request of one trace, sent in two arms). None where either arm
    has no samples. ``reps`` in the result is the number of requests. Quantiles interpolate as ``percentile``."""
    return paired_quantile_products([base, co], [-1, 1], quantiles, resamples=resamples, seed=seed)


def paired_quantile_products(
    arms: t.Sequence[t.Sequence[t.Sequence[float]]],
    powers: t.Sequence[int],
    quantiles: t.Sequence[float],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> list[Interval | None]:
    """Per quantile: the product over arms of (the arm's quantile) ** its power, with a 95 % interval from
    resampling the requests jointly: request i of every arm is the same request of one trace. Powers -1 and 1 give
    a ratio; four arms with -1, 1, 1, -1 a ratio of two inflations over the same trace (two runs, each with its
    own online-alone baseline), whose correlation through the shared requests the joint resampling keeps. None where
    an arm has no samples; ``reps`` is the number of requests."""
    if len(arms) != len(powers):
        raise ValueError("one power per arm")
    if len({len(arm) for arm in arms}) > 1:
        raise ValueError("paired arms must hold the same requests")
    n = len(arms[0])
    sorted_arms = [_Arm.of(arm) for arm in arms]
    if any(len(arm.values) == 0 for arm in sorted_arms):
        return [None] * len(quantiles)
    qs = np.asarray(quantiles, float)
    exponents = np.asarray(powers, float)[:, None]

    def product(counts: np.ndarray) -> np.ndarray | None:
        found = [arm.quantiles(counts, qs) for arm in sorted_arms]
        if any(q is None for q in found):
            return None
        return t.cast(np.ndarray, np.prod(np.asarray(found, float) ** exponents, axis=0))

    value = t.cast(np.ndarray, product(np.ones(n, int)))
    rng = np.random.default_rng(seed)
    products = np.full((resamples, len(qs)), np.nan)
    for i in range(resamples):
        drawn = product(np.bincount(rng.integers(0, n, n), minlength=n))
        if drawn is not None:
            products[i] = drawn
    tail = (1 - CONFIDENCE) / 2
    low, high = np.nanquantile(products, [tail, 1 - tail], axis=0)
    return [Interval(float(v), float(lo), float(hi), n) for v, lo, hi in zip(value, low, high, strict=True)]


@dataclasses.dataclass(frozen=True)
class _Arm:
    """One arm's samples sorted once, each with the request it came from."""

    values: np.ndarray
    owner: np.ndarray

    @classmethod
    def of(cls, per_request: t.Sequence[t.Sequence[float]]) -> _Arm:
        values = np.concatenate([np.asarray(x, float) for x in per_request]) if per_request else np.zeros(0)
        owner = np.repeat(np.arange(len(per_request)), [len(x) for x in per_request])
        order = np.argsort(values, kind="stable")
        return cls(values[order], owner[order])

    def quantiles(self, counts: np.ndarray, qs: np.ndarray) -> np.ndarray | None:
        """The quantiles of the samples with request i's taken counts[i] times (None: none taken), interpolated
        between order statistics as ``percentile`` does, without building the repeated sample."""
        cum = np.cumsum(counts[self.owner])
        total = int(cum[-1])
        if total == 0:
            return None
        h = (total - 1) * qs
        lo = np.floor(h).astype(int)
        hi = np.minimum(lo + 1, total - 1)
        v_lo = self.values[np.searchsorted(cum, lo, side="right")]
        v_hi = self.values[np.searchsorted(cum, hi, side="right")]
        return v_lo + (v_hi - v_lo) * (h - lo)
