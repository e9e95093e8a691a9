"""Laxity-driven priority: how much slack a batch has left, and what it buys.

drain = remaining / observed rate; laxity = (expires_at - now) - drain;
urgency u = clamp(1 - laxity / H, 0, 1); priority = round(100 - 99 u).

While a batch drains at its observed rate the two time terms cancel and its
laxity is constant, so a healthy batch never escalates however much of its
window has passed; only a falling rate (or the deadline itself) moves it.

A tenant's batches of one model are judged together (``tenant_laxities``): its
claims drain them earliest deadline first at the tenant's share, so the rate
that matters is the tenant's over all of them, and a batch waiting behind a
sibling is not late for it.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import math

PRIORITY_MAX = 100  # the least urgent batch priority (vLLM: lower is sooner)
_ONE_TAU = -math.expm1(-1.0)  # the estimator's weight after watching for one time constant


@dataclasses.dataclass(frozen=True)
class RateEstimator:
    """Items per second, as an exponentially weighted rate over time constant ``tau``.

    Fed the batch's cumulative completed count whenever it is looked at
    (``observe(now, done)``), at any spacing: each interval's rate is blended
    in with weight ``1 - exp(-dt / tau)``, so a burst is spread over ``tau``
    and a pause pulls the rate toward 0 (a stalled batch's laxity shrinks).
    The blend starts from nothing and is divided by the weight gathered so far
    (as Adam corrects its moments), so a batch that has run steadily for only
    a few seconds already reads its true rate instead of a fraction of it.

    The rate is ``None`` ("no rate yet") until the first completion, or
    until one time constant has been watched without any: a batch that has
    completed nothing for ``tau`` reads 0 and escalates rather than waiting for
    its deadline. A completed count that falls (a rebuilt count) is a new
    baseline.
    """

    tau: float = 900.0  # settings.rate_tau_seconds
    last_at: float | None = None
    last_done: int = 0
    mean: float = 0.0  # weighted mean of interval rates, biased toward 0 by the missing weight
    weight: float = 0.0  # 1 - exp(-observed time / tau)
    seen_completion: bool = False

    def observe(self, now: float, done: int) -> RateEstimator:
        if self.last_at is None or done < self.last_done:
            return dataclasses.replace(self, last_at=now, last_done=done)
        dt = now - self.last_at
        if dt <= 0:
            return self
        g = -math.expm1(-dt / self.tau)
        x = (done - self.last_done) / dt
        return dataclasses.replace(
            self,
            last_at=now,
            last_done=done,
            mean=self.mean + g * (x - self.mean),
            weight=self.weight + g * (1 - self.weight),
            seen_completion=self.seen_completion or done > self.last_done,
        )

    @property
    def rate(self) -> float | None:
        if not self.seen_completion and self.weight < _ONE_TAU:
            return None
        return self.mean / self.weight


def drain_seconds(remaining: int, rate: float | None) -> float:
    """Time to finish ``remaining`` items at ``rate``.

    With no rate yet the drain counts as 0, so a fresh batch has its whole
    window as laxity and sits at priority 100 until it has evidence; a rate of
    0 never finishes: infinite drain.
    """
    if remaining <= 0 or rate is None:
        return 0.0
    if rate <= 0:
        return math.inf
    return remaining / rate


def laxity_seconds(expires_at: float, now: float, remaining: int, rate: float | None) -> float:
    return (expires_at - now) - drain_seconds(remaining, rate)


def tenant_laxities(now: float, batches: cabc.Sequence[tuple[float, int]], rate: float | None) -> list[float]:
    """The laxity of each of one tenant's batches of a model, given as ``(expires_at, remaining)`` (any order; the
    answer in the same order), when the tenant drains them earliest deadline first at ``rate``, its observed rate
    over all of them.

    A batch is done once it and every batch due before it are: ``L_i = (expires_i - now) - drain(remaining due by
    i)``. A batch with items left holds up every batch due after it, so its laxity is the least ``L`` of itself and
    those; one with nothing left holds up nobody and keeps ``expires - now``. One batch therefore reads as
    ``laxity_seconds``, and the same items split into many batches of the same deadlines read as that one batch,
    never more urgent: the sibling that waits while another drains is not late for waiting.
    """
    order = sorted(range(len(batches)), key=lambda i: batches[i][0])
    own: list[float] = []
    due = 0
    for i in order:
        expires_at, remaining = batches[i]
        due += max(0, remaining)
        own.append(laxity_seconds(expires_at, now, due if remaining > 0 else 0, rate))
    out = [0.0] * len(batches)
    least = math.inf
    for k in reversed(range(len(order))):
        least = min(least, own[k])
        out[order[k]] = least if batches[order[k]][1] > 0 else own[k]
    return out


def settled_since(before: cabc.Mapping[str, int], now: cabc.Mapping[str, int]) -> int:
    """Items a tenant's batches settled between two looks, from each batch's settled count then and now.

    A batch first seen now counts from now (its baseline); one whose count fell (a rebuilt count) adds nothing.
    ``now`` holds the batches that left since the last look too, at their final counts, so their last items count.
    """
    return sum(max(0, done - before[batch]) for batch, done in now.items() if batch in before)


def urgency(laxity: float, horizon: float) -> float:
    """0 while the laxity is at least the horizon H, rising to 1 as it reaches 0."""
    return min(1.0, max(0.0, 1.0 - laxity / horizon))


def priority_for(urgency: float, priority_min: int = 1, sla_strict: bool = False) -> int:
    """vLLM priority for a batch: 100 at urgency 0, 1 at urgency 1.

    Priority 0 is online traffic's; a batch gets it only under ``sla_strict``
    and only at urgency 1 (laxity gone: it misses its window at its rate).
    """
    if sla_strict and urgency >= 1.0:
        return 0
    return max(priority_min, 1, round(PRIORITY_MAX - urgency * (PRIORITY_MAX - 1)))


def floor_engaged(urgency: float, threshold: float = 0.9) -> bool:
    return urgency >= threshold


def floor_slots(pool: int, share: float) -> int:
    """The most items the floor may hold on a node with ``pool`` threads, all urgent tenants together: a share of
    the pool, at least one (the floor is a minimum for the urgent, not a second gate to pass)."""
    return max(1, math.floor(share * pool))


@dataclasses.dataclass
class TokenBucket:
    """Admits up to ``rate`` per second with bursts of ``burst``; starts full.

    The SLA floor: a tenant with urgent batches takes a token per item and is
    admitted past a closed gate while tokens last. Time only comes in through
    ``take``.
    """

    rate: float
    burst: float = 1.0
    tokens: float | None = None
    last_at: float | None = None

    def take(self, now: float) -> bool:
        if self.tokens is None:
            self.tokens = self.burst
        elif self.last_at is not None and now > self.last_at:
            self.tokens = min(self.burst, self.tokens + (now - self.last_at) * self.rate)
        self.last_at = now if self.last_at is None else max(now, self.last_at)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
