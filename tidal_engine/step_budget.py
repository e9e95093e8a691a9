"""The relative step budget (issue 36): a step with online traffic may take at most ``alpha_set`` times what its
online work alone would take; batch requests join it one at a time, each priced by what it adds.

The absolute budget (the TBT SLO less its guard) is 160 ms a step by default where a decode step with online work
alone takes ~26 ms on an A6000, and it charged every step the KV of every running request, parked ones included,
so it could not price one more batch decode. Here:

- T̂(P, C, pairs) is a step of P tokens over C resident tokens with ``pairs`` (query, key) pairs of attention: the
  profile's form (``step_time.step_seconds``, knee included) where the engine's profile is known, else the latency
  model's rolling fit (``latency.py``). The scheduler says which (``TIDAL_SCHED_PROFILE``).
- The budget is ``alpha_set × T̂(online alone)``, under the absolute budget as a ceiling, and never under the
  online work itself: online is never held back.
- Running batch requests join in the order given (the scheduler's: those that ran last step first, so a working
  set finishes, then the longest parked), each charged T̂ with it minus T̂ without: its tokens and its own KV read.
  One that does not fit sits the step out (parked, its KV kept, charged nothing); a later, cheaper one may fit. A
  prefill in progress that does not fit whole takes the chunk that does, unless online requests wait (the stock
  loop would give that chunk the budget kept for them), and then nothing more joins.
- What the budget still allows after them is room for a waiting batch request's prefill chunk.

So the working set, the batch requests decoding per step, follows from the budget. Pure: no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
import typing as t

from tidal_engine.step_time import sequence_pairs

StepCost = t.Callable[[int, int, int], float]  # T̂(tokens, resident context, attention pairs) in seconds


@dataclasses.dataclass(frozen=True)
class Work:
    """One request's part of a step."""

    request_id: str
    tokens: int  # tokens it asks for this step
    context: int  # tokens already in its KV, which its attention reads


@dataclasses.dataclass(frozen=True)
class Selection:
    alone_s: float  # T̂ of the step's online work alone: the reference
    budget_s: float  # what the step may take
    scheduled: tuple[str, ...]  # running batch requests that take part, in the order given
    parked: tuple[str, ...]  # running batch requests that sit the step out
    batch_tokens: int  # X: the scheduled batch requests' tokens plus the room
    room: int  # of X, tokens for waiting batch requests (a prefill chunk)
    predicted_s: float  # T̂ of the whole step as selected


@dataclasses.dataclass
class _Step:
    tokens: int = 0
    context: int = 0
    pairs: int = 0

    def plus(self, tokens: int, context: int) -> _Step:
        return _Step(self.tokens + tokens, self.context + context, self.pairs + sequence_pairs(tokens, context))

    def seconds(self, cost: StepCost) -> float:
        return cost(self.tokens, self.context, self.pairs)


def select(
    cost: StepCost,
    online: t.Sequence[Work],
    batch: t.Sequence[Work],
    alpha_set: float,
    ceiling_s: float,
    max_tokens: int,
    *,
    chunk_allowed: bool,
    admit_room: bool,
) -> Selection:
    """The step's batch part under ``alpha_set`` × T̂(online alone) (module docstring). ``max_tokens``: τ."""
    step = _Step()
    for w in online:
        step = step.plus(w.tokens, w.context)
    alone = step.seconds(cost)
    budget = max(alone, min(alpha_set * alone, ceiling_s))
    scheduled: list[str] = []
    parked: list[str] = []
    batch_tokens = 0
    spent = False  # a chunk took the rest of the budget
    for w in batch:
        if spent:
            parked.append(w.request_id)
            continue
        take = w.tokens if _fits(cost, step, w.tokens, w.context, budget, max_tokens) else 0
        if not take and w.tokens > 1 and chunk_allowed:
            take = _largest(cost, step, w.context, budget, max_tokens, w.tokens - 1)
            spent = take > 0
        if take:
            step = step.plus(take, w.context)
            scheduled.append(w.request_id)
            batch_tokens += take
        else:
            parked.append(w.request_id)
    room = 0
    if admit_room and not spent:
        room = _largest(cost, step, 0, budget, max_tokens, max_tokens - step.tokens)
    predicted = step.plus(room, 0).seconds(cost) if room else step.seconds(cost)
    return Selection(alone, budget, tuple(scheduled), tuple(parked), batch_tokens + room, room, predicted)


def _fits(cost: StepCost, step: _Step, tokens: int, context: int, budget: float, max_tokens: int) -> bool:
    return step.tokens + tokens <= max_tokens and step.plus(tokens, context).seconds(cost) <= budget


def _largest(cost: StepCost, step: _Step, context: int, budget: float, max_tokens: int, most: int) -> int:
    """The most tokens k ≤ ``most`` one request over ``context`` adds to ``step`` within the budget (T̂ rising
    with k); 0 if not even one."""

    def fits(k: int) -> bool:
        return _fits(cost, step, k, context, budget, max_tokens)

    if most <= 0 or not fits(1):
        return 0
    lo, hi = 1, most  # fits(lo) holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
