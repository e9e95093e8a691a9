"""Steady windows: when a co-served window may open, and whether what it measured was a steady state (issue 35).

A harvest figure is only worth reporting from a steady state: the batch requests at the engine neither filling up
nor draining, and the batch prefilling as many prompt tokens per generated token as its mix does in the long run.
A window that opens while the gate is still at its cap, or while the items at the engine were admitted (and
prefilled) before it, measures a transient: the audit behind issue 35 found windows at 0.5-1.2 prefill tokens per
generated token against 2.04 in steady state, and harvests above any steady state's compute bound.

- ``admission``: the window opens only once the batch requests at the engine have held one level for ``hold_s``
  and as many batch requests have completed since that level was reached as it holds: the requests at the engine
  then were admitted at that level, not in the ramp. "Held" is judged on means over blocks of ``hold_s`` / 2, each
  within ``TOLERANCE`` of the level (at least one request either way), not on every sample: a gate's AIMD saws
  around its mean, and a sawtooth that is steady on average must settle (the quick run's did not, sample by
  sample).
- ``judge``: after it closes, a window is valid when (1) its batch requests at the engine drift less than
  ``DRIFT_MAX`` (the difference between the means of its two halves, over the window's mean; not applied to a
  diurnal phase, whose load moves on purpose), or by less than ``DRIFT_FLOOR_REQUESTS`` (a gate holding two or
  three requests, or a relative budget decoding five to seven, moves 10 % by its counting alone), (2) its batch prefill per generated token is a steady state's:
  over ``MIN_COMPLETIONS`` batch completions or more, within ``RATIO_TOLERANCE`` of the mix's steady value; over
  fewer, its 95 % interval contains the steady value (a window at a small knob completes a few dozen requests, whose
  prompts swing the point estimate by a quarter: the tolerance would ask of it a precision its count cannot give),
  and (3) the twin paced all but ``OVERRUN_MAX`` of its steps. A window that fails is reported with every reason,
  never averaged in.

Pure: samples in, a verdict out; the benchmark takes the samples (frontier.py) and the report re-judges them.
"""

from __future__ import annotations

import dataclasses
import typing as t

import numpy as np

TOLERANCE = 0.10  # admission's band around its level
DRIFT_MAX = 0.10
DRIFT_FLOOR_REQUESTS = 1.0  # a drift under one request is no drift, whatever its share of a level of a few
RATIO_TOLERANCE = 0.10
MIN_COMPLETIONS = 200
OVERRUN_MAX = 0.05
BLOCK_S = 10.0  # the ratio's interval resamples blocks this long: neighbouring seconds share their requests
RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Sample:
    """One reading during a phase; the counters are cumulative, so a window's figures are differences."""

    at: float  # seconds (monotonic clock)
    at_engine: float  # batch requests at the engine now
    completions: float  # batch requests completed so far
    prefill: float  # batch prompt tokens prefilled so far
    generated: float  # batch tokens generated so far


@dataclasses.dataclass(frozen=True)
class Admission:
    settled: bool
    level: float  # batch requests at the engine, mean of the last hold_s
    since: float | None  # when the current level was reached (the stretch's first sample)
    turnover: float  # batch completions since then


def admission(samples: t.Sequence[Sample], hold_s: float, tolerance: float = TOLERANCE) -> Admission:
    """Whether the batch's admission has settled by the last sample (module docstring)."""
    means = _block_means(samples, hold_s / 2)
    if len(means) < 2:
        return Admission(False, float(means[0][1]) if means else 0.0, None, 0.0)
    level = (means[0][1] + means[1][1]) / 2
    band = max(tolerance * level, 1.0)
    held = 0
    while held < len(means) and abs(means[held][1] - level) <= band:
        held += 1
    if held < 2:  # the last hold_s itself is off its own level
        return Admission(False, level, None, 0.0)
    first = means[held - 1][0]
    since = samples[first].at
    turnover = samples[-1].completions - samples[first].completions
    settled = level > 0 and turnover >= level
    return Admission(settled, level, since, turnover)


def _block_means(samples: t.Sequence[Sample], block_s: float) -> list[tuple[int, float]]:
    """Back from the last sample, whole blocks of ``block_s``: (the index of the block's first sample, the mean of
    its batch requests at the engine), the latest block first."""
    out: list[tuple[int, float]] = []
    if not samples:
        return out
    end, i = samples[-1].at, len(samples) - 1
    while end - block_s >= samples[0].at:
        start, levels = end - block_s, []
        while i >= 0 and samples[i].at > start:
            levels.append(samples[i].at_engine)
            i -= 1
        if not levels:
            break
        out.append((i + 1, float(np.mean(levels))))
        end = start
    return out


def within(samples: t.Sequence[Sample], start: float, end: float) -> list[Sample]:
    """The samples of the window [start, end]."""
    return [s for s in samples if start <= s.at <= end]


def drift(samples: t.Sequence[Sample]) -> float | None:
    """|mean of the second half − mean of the first half| ÷ the window's mean, of the batch requests at the engine;
    the halves split at the window's middle instant. None under two samples or with nothing at the engine."""
    if len(samples) < 2:
        return None
    middle = (samples[0].at + samples[-1].at) / 2
    first = [s.at_engine for s in samples if s.at <= middle]
    second = [s.at_engine for s in samples if s.at > middle]
    mean = float(np.mean([s.at_engine for s in samples]))
    if not first or not second or mean <= 0:
        return None
    return abs(float(np.mean(second)) - float(np.mean(first))) / mean


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A window cut into blocks of about ``BLOCK_S``: per block, its seconds and its counters' increments."""

    seconds: np.ndarray
    prefill: np.ndarray
    generated: np.ndarray


def blocks(samples: t.Sequence[Sample], block_s: float = BLOCK_S) -> Blocks:
    """The window's samples cut into blocks of ``block_s`` (the last, shorter block kept)."""
    seconds, prefill, generated = [], [], []
    start = 0
    for i in range(1, len(samples)):
        if samples[i].at - samples[start].at >= block_s or i == len(samples) - 1:
            seconds.append(samples[i].at - samples[start].at)
            prefill.append(samples[i].prefill - samples[start].prefill)
            generated.append(samples[i].generated - samples[start].generated)
            start = i
    return Blocks(np.array(seconds, float), np.array(prefill, float), np.array(generated, float))


def ratio_interval(
    numerators: np.ndarray, denominators: np.ndarray, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """The 95 % interval of Σ numerators ÷ Σ denominators, blocks resampled with replacement; None under 3 blocks.
    Prefill per generated token (prefill, generated), or a rate (tokens, seconds)."""
    if len(numerators) < 3:
        return None
    return _bounds(_resampled(numerators, denominators, np.random.default_rng(seed), resamples))


def ratio_of_ratios_interval(
    arm: tuple[np.ndarray, np.ndarray], base: tuple[np.ndarray, np.ndarray], resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """The 95 % interval of one window's Σ numerators ÷ Σ denominators over another's (a rate in two runs), each
    window's blocks resampled on their own: two windows share no blocks. None where either has under 3 blocks."""
    if min(len(arm[0]), len(base[0])) < 3:
        return None
    rng = np.random.default_rng(seed)
    return _bounds(_resampled(*arm, rng, resamples) / _resampled(*base, rng, resamples))


def _resampled(
    numerators: np.ndarray, denominators: np.ndarray, rng: np.random.Generator, resamples: int
) -> np.ndarray:
    picks = rng.integers(0, len(numerators), (resamples, len(numerators)))
    num, den = numerators[picks].sum(axis=1), denominators[picks].sum(axis=1)
    return np.divide(num, den, out=np.full(resamples, np.inf), where=den > 0)


def _bounds(ratios: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


@dataclasses.dataclass(frozen=True)
class Verdict:
    valid: bool
    reasons: tuple[str, ...]
    seconds: float
    drift: float | None
    prefill_per_generated: float | None
    steady_ratio: float
    ratio_interval: tuple[float, float] | None
    completions: float
    overrun_share: float | None

    def as_dict(self) -> dict[str, t.Any]:
        return dataclasses.asdict(self)


def judge(
    samples: t.Sequence[Sample],
    steady_ratio: float,
    *,
    overrun_share: float | None,
    drift_rule: bool = True,
    ratio_rule: bool = True,
) -> Verdict:
    """The window's verdict (module docstring) from its samples, the mix's steady prefill per generated token and
    the share of its steps the twin could not pace (None: no trace, an engine that is not a twin). Without
    ``ratio_rule`` (a step in the online load, which moves the batch on purpose) rules (2) and (3) are not
    applied."""
    reasons = []
    if len(samples) < 2:
        return Verdict(False, ("fewer than two samples in the window",), 0.0, None, None, steady_ratio, None, 0.0, None)
    seconds = samples[-1].at - samples[0].at
    completions = samples[-1].completions - samples[0].completions
    prefill = samples[-1].prefill - samples[0].prefill
    generated = samples[-1].generated - samples[0].generated
    ratio = prefill / generated if generated > 0 else None
    cut = blocks(samples)
    interval = ratio_interval(cut.prefill, cut.generated)
    d = drift(samples)
    mean_level = float(np.mean([s.at_engine for s in samples]))
    if drift_rule and (d is None or (d >= DRIFT_MAX and d * mean_level >= DRIFT_FLOOR_REQUESTS)):
        level = "none at the engine" if d is None else f"{100 * d:.1f} %"
        reasons.append(f"batch requests at the engine drift {level} across the window (limit {100 * DRIFT_MAX:.0f} %)")
    if ratio is None:
        reasons.append("no batch tokens generated in the window")
    elif ratio_rule:
        reasons += _ratio_reasons(ratio, interval, completions, steady_ratio)
    reasons += overrun_reasons(overrun_share)
    return Verdict(not reasons, tuple(reasons), seconds, d, ratio, steady_ratio, interval, completions, overrun_share)


def _ratio_reasons(
    ratio: float, interval: tuple[float, float] | None, completions: float, steady_ratio: float
) -> list[str]:
    """Rule (2) of the module docstring."""
    if completions >= MIN_COMPLETIONS:
        if abs(ratio / steady_ratio - 1) <= RATIO_TOLERANCE:
            return []
        return [
            f"batch prefill per generated token {ratio:.3f}, not within {100 * RATIO_TOLERANCE:.0f} % "
            f"of the mix's steady {steady_ratio:.3f}"
        ]
    if interval is not None and interval[0] <= steady_ratio <= interval[1]:
        return []
    shown = "no interval (under 3 blocks)" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"
    return [
        f"{completions:.0f} batch completions (fewer than {MIN_COMPLETIONS}) and the ratio's 95 % interval "
        f"{shown} does not contain the steady {steady_ratio:.3f} (point {ratio:.3f})"
    ]


def overrun_reasons(overrun_share: float | None) -> list[str]:
    """The overrun rule, which every window obeys (an online-alone one too)."""
    if overrun_share is None or overrun_share <= OVERRUN_MAX:
        return []
    return [
        f"the twin could not pace {100 * overrun_share:.1f} % of the window's steps (limit {100 * OVERRUN_MAX:.0f} %)"
    ]
