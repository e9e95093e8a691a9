"""The KV guardband: KV-cache headroom kept free for online bursts.

H follows an EWMA of the KV fraction online requests hold or want, clamped to
[h_min, h_max]. Above KV usage 1 − H no new batch request is admitted; above
1 − H/2 one resident batch request is evicted per step, the one whose eviction
wastes least. Preemption in vLLM is recompute-only but the prefix cache
survives it, so what an eviction loses is the computed work that did not come
from the prefix cache. Pure: no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
import typing as t


@dataclasses.dataclass(frozen=True)
class Resident:
    """A running batch request as the guardband sees it."""

    request_id: str
    num_computed_tokens: int
    num_cached_tokens: int  # of those, how many came from the prefix cache at admission

    @property
    def unrecoverable(self) -> int:
        return max(self.num_computed_tokens - self.num_cached_tokens, 0)


class Guardband:
    def __init__(self, h_min: float = 0.05, h_max: float = 0.30, alpha: float = 0.05):
        assert 0.0 <= h_min <= h_max < 1.0, "guardband clamps must satisfy 0 <= h_min <= h_max < 1"
        self.h_min, self.h_max, self.alpha = h_min, h_max, alpha
        self._ewma = h_min

    @property
    def h(self) -> float:
        return min(max(self._ewma, self.h_min), self.h_max)

    def observe(self, online_demand: float) -> float:
        """Fold in one step's online KV demand (a fraction of the KV pool); return H."""
        self._ewma += self.alpha * (online_demand - self._ewma)
        return self.h

    def admits(self, kv_usage: float) -> bool:
        """Whether a new batch request may be admitted at this KV usage."""
        return kv_usage <= 1.0 - self.h

    def must_evict(self, kv_usage: float) -> bool:
        return kv_usage > 1.0 - self.h / 2.0


def eviction_cost(resident: Resident) -> tuple[int, int]:
    """What evicting ``resident`` loses: its unrecoverable work (ties: the fewest computed tokens)."""
    return resident.unrecoverable, resident.num_computed_tokens


def cheapest_first(residents: t.Iterable[Resident]) -> list[Resident]:
    """Residents in the order their eviction loses least work."""
    return sorted(residents, key=eviction_cost)


def cheapest(residents: t.Iterable[Resident]) -> Resident | None:
    """The resident whose eviction loses the least work."""
    return min(residents, key=eviction_cost, default=None)
