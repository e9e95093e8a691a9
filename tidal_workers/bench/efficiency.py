"""E: a harvest as a share of the most any scheduler could harvest at the latency it cost (issue 35 item 3).

E = harvest ÷ H*(α_m), with α_m = max(1.10, the largest of the point's TTFT and TBT inflations at p50 and p99): the
oracle (oracle.py) at the step inflation the point's online requests actually saw, floored where inflations this
small are within what a steady state's noise can show. H* is computed on the exact profile the twin ran (its name
and hash go in the JSON beside it), for the point's online rate and batch mix. A diurnal phase is compared
quasi-statically: H*(α_m) averaged over its rate, sampled across the phase (a rate at which online alone does not
fit leaves no harvest: 0 there).

Pure: the oracle is a calculation. ``Oracles`` caches it per (α to 3 decimals, rate), since a report asks for the
same ones many times.
"""

from __future__ import annotations

import typing as t

import numpy as np

from tidal_engine.step_time import Profile
from tidal_workers.bench import oracle
from tidal_workers.bench.oracle import RequestClass

ALPHA_FLOOR = 1.10
DIURNAL_SAMPLES = 24  # rates sampled across a diurnal phase for the quasi-static mean


def alpha_m(inflations: t.Iterable[float | None]) -> float:
    """The step inflation a point is judged at: its largest latency inflation, at least ``ALPHA_FLOOR``."""
    return max([ALPHA_FLOOR, *(x for x in inflations if x is not None and np.isfinite(x))])


class Oracles:
    """H*(α) for one profile, online class and batch mix, at any online rate; cached."""

    def __init__(self, profile: Profile, online: RequestClass, batch: RequestClass):
        self.profile, self.online, self.batch = profile, online, batch
        self._cache: dict[tuple[float, float], float] = {}

    def h_star(self, alpha: float, rate: float) -> float:
        key = (round(alpha, 3), round(rate, 4))
        if key not in self._cache:
            try:
                found = oracle.harvest_oracle(self.profile, key[1], self.online, self.batch, key[0])
                self._cache[key] = found.batch_tokens_per_s
            except ValueError:  # online alone does not fit at this rate
                self._cache[key] = 0.0
        return self._cache[key]

    def h_star_over(self, alpha: float, rates: t.Sequence[float]) -> float:
        """The quasi-static H*(α) of a phase whose rate moves: the mean over ``rates`` sampled evenly in time."""
        return float(np.mean([self.h_star(alpha, r) for r in rates]))

    def steady_ceiling(self) -> float:
        return oracle.steady_ceiling(self.profile, self.batch)


def phase_rates(rate_fn: t.Callable[[float], float], seconds: float, samples: int = DIURNAL_SAMPLES) -> list[float]:
    """The rate at the middle of each of ``samples`` equal slices of a phase."""
    return [rate_fn((i + 0.5) * seconds / samples) for i in range(samples)]


def efficiency(harvest: float, h_star: float) -> float | None:
    """E; None when the oracle leaves no harvest at all (nothing to be a share of)."""
    return harvest / h_star if h_star > 0 else None


def peer_at(alpha: float, curve: t.Iterable[tuple[float, float]]) -> float | None:
    """The peer's harvest at ``alpha`` from its measured (α_m, harvest) points: linear between them, starting at
    online alone (no batch, 0 tokens/s at ``ALPHA_FLOOR``), and never falling as α rises (a peer setting that
    harvests less at a higher α is beaten by one at a lower). None past the peer's highest point: not extrapolated.
    """
    best: dict[float, float] = {ALPHA_FLOOR: 0.0}
    for a, harvest in curve:
        best[a] = max(best.get(a, 0.0), harvest)
    alphas = sorted(best)
    if alpha > alphas[-1]:
        return None
    harvests = np.maximum.accumulate([best[a] for a in alphas])
    return float(np.interp(alpha, alphas, harvests))


def over_peer(
    harvest: tuple[float, float | None, float | None],
    alpha: tuple[float, float | None, float | None],
    curve: t.Sequence[tuple[float, float]],
) -> dict[str, float | None]:
    """A technique's harvest over the peer's at its α_m, each as (mean, low, high), with bounds that carry both
    intervals: the low end is the harvest's low over the peer at α_m's high, the high end the harvest's high over
    the peer at α_m's low (the peer's curve never falls, so these are the worst and best pairings). On a steep peer
    curve α_m's interval moves the ratio more than the harvest's does. An end is None where it cannot be read: the
    peer is not measured that far up (not extrapolated), or it harvests nothing there (no ratio)."""

    def ratio(tokens: float | None, at: float | None) -> float | None:
        if tokens is None or at is None:
            return None
        peer = peer_at(at, curve)
        return tokens / peer if peer else None

    return {
        "value": ratio(harvest[0], alpha[0]),
        "low": ratio(harvest[1], alpha[2]),
        "high": ratio(harvest[2], alpha[1]),
    }
