"""The relative step budget (issue 36): a step with online traffic may take at most ``alpha_set`` times what its
online work alone would take; batch requests join it one at a time, each priced by what it adds.

The absolute budget (the TBT SLO less its guard) is 160 ms a step by default where a decode step with online work
alone takes ~26 ms on an A6000, and it charged every step the KV of every running request, parked ones included,
so it could not price one more batch decode. Here:

- T̂(P, C, pairs) is a step of P tokens over C resident tokens with ``pairs`` (query, key) pairs of attention: the
  profile's form (``step_time.step_seconds``, knee included) where the engine's profile is known, else the latency
  model's rolling fit (``latency.py``). The scheduler says which (``TIDAL_SCHED_PROFILE``). Every step priced is
  also charged the host's time around its forward, a fixed part and a part per request (``host_time.py``): an
  online token waits the whole cycle.
- The budget is ``alpha_set × T̂(online alone)``, under the absolute budget as a ceiling, and never under the
  online work itself: online is never held back. "Alone" is the online work as it would run with no batch: its
  decodes thinned by ι, the concurrency the batch's latency added (Little's law: the online requests running grow
  with the step time; the scheduler passes its measured inflation). Priced on the step's own online work, the
  measured inflation ran 0.03-0.04 over α_set on the twin (45.8 online requests running alone, 53 beside the
  batch); thinned, about half that (docs/engine.md).
- Running batch requests join in the order given (the scheduler's: the most urgent priority, then those that ran
  last step, so a working set finishes, then the longest parked), each charged what it adds to T̂: its tokens and
  its own KV read. The longest run of them, in that order, that fits the budget takes part; the rest sit the step
  out (parked, KV kept, charged nothing). One that would not fit even alone beside the online work is set aside
  first, so that it cannot hold up the ones behind it. A prefill in progress that does not fit whole takes the
  chunk that does, unless online requests wait (the stock loop would give that chunk the budget kept for them).
- What the budget still allows after them is room for a waiting batch request's prefill chunk, but only once
  every running batch request that could fit has taken part. Prefilling a new prompt while one is parked grows a
  pool of prefilled requests that the budget cannot decode: they hold KV, are released after
  ``TIDAL_SCHED_MAX_PARK_SECONDS`` and prefilled again (at α 1.1 on the twin, 185 batch requests were prefilled
  beside a working set of ~25, and 162 were released in 9 minutes).

So the working set, the batch requests decoding per step, follows from the budget. Pure: no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
import typing as t

import numpy as np
import numpy.typing as npt

from tidal_engine.host_time import NONE
from tidal_engine.host_time import HostTime
from tidal_engine.step_time import sequence_pairs

Ints = npt.NDArray[np.int64]
# T̂ of whole steps, element by element: (tokens, resident context, attention pairs) -> seconds
StepCost = t.Callable[[Ints, Ints, Ints], npt.NDArray[np.float64]]


@dataclasses.dataclass(frozen=True)
class Work:
    """One request's part of a step."""

    request_id: str
    tokens: int  # tokens it asks for this step
    context: int  # tokens already in its KV, which its attention reads


@dataclasses.dataclass(frozen=True)
class Selection:
    alone_s: float  # the reference: T̂ of the step's online work alone, its decodes thinned by ι
    budget_s: float  # what the step may take
    scheduled: tuple[str, ...]  # running batch requests that take part, in the order given
    parked: tuple[str, ...]  # running batch requests that sit the step out
    batch_tokens: int  # X: the scheduled batch requests' tokens plus the room
    room: int  # of X, tokens for waiting batch requests (a prefill chunk)
    predicted_s: float  # T̂ of the whole step as selected
    carries_more: bool  # every running batch request took part, and one more decode like theirs would fit too


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
    concurrency_inflation: float = 1.0,
    host: HostTime = NONE,
) -> Selection:
    """The step's batch part under ``alpha_set`` × T̂(online alone) (module docstring). ``max_tokens``: τ; ``host``:
    the host's time a step takes beyond T̂, charged to every step priced (host_time.py).

    Every candidate step is priced at once (one vector per question, a few hundred requests in tens of
    microseconds): the plugin's time is the online step's time too."""
    price = _Pricer(cost, host, max_tokens)
    base = _totals(online)
    alone = price.one(base)
    reference = alone if concurrency_inflation == 1 else price.one(_thinned(online, base, concurrency_inflation))
    budget = max(alone, min(alpha_set * reference, ceiling_s))
    tokens, context, pairs = _columns(batch)
    ones = np.ones_like(tokens)
    # Room first: in a step without online prompts waiting (prefill is cheap under the knee) and none in progress,
    # a new prompt's chunk goes before the decodes. The pool is short, and a decode step's room is only a few
    # decodes: after them there would be none left, and the pool would never grow to what prompt steps carry.
    room = 0
    head = base
    if admit_room and chunk_allowed and not (tokens > 1).any():
        room = price.largest(base, 0, budget, max_tokens - base[0])
        head = _joined(base, room, 0) if room else base

    def fits(t_: Ints, c_: Ints, p_: Ints, n_: Ints) -> npt.NDArray[np.bool_]:
        return price.fit((head[0] + t_, head[1] + c_, head[2] + p_, head[3] + n_), budget)

    # Set aside first what does not fit even alone beside the online work and cannot be cut to fit: a decode, or
    # a prefill while chunks are not allowed. It holds nobody up.
    cuttable = (tokens > 1) & chunk_allowed
    order = np.flatnonzero(fits(tokens, context, pairs, ones) | cuttable)
    prefix = fits(*(np.cumsum(column[order]) for column in (tokens, context, pairs, ones)))
    taken = int(np.argmin(prefix)) if not prefix.all() else len(order)  # the longest run that fits
    chosen = [int(i) for i in order[:taken]]
    step = (
        head[0] + int(tokens[chosen].sum()),
        head[1] + int(context[chosen].sum()),
        head[2] + int(pairs[chosen].sum()),
        head[3] + len(chosen),
    )
    chunk = 0
    if taken < len(order) and cuttable[order[taken]]:  # the first that does not fit, a prefill: what fits of it
        nxt = int(order[taken])
        chunk = price.largest(step, int(context[nxt]), budget, int(tokens[nxt]) - 1)
        if chunk:
            chosen.append(nxt)
            step = _joined(step, chunk, int(context[nxt]))
    everyone_in = taken == len(order)  # no running request that fits alone sits the step out
    carries_more = everyone_in and len(order) == len(batch) and not chunk
    if carries_more and len(batch):  # and one more decode, over the longest context of theirs, would fit too
        longest = int(context.max())
        one_more = _joined(step, 1, longest)
        carries_more = bool(price.fit(tuple(np.array([x]) for x in one_more), budget)[0])
    if admit_room and everyone_in and not chunk and not room:
        room = price.largest(step, 0, budget, max_tokens - step[0])
        step = _joined(step, room, 0) if room else step
    scheduled = [batch[i].request_id for i in chosen]
    taking = set(chosen)
    parked = [w.request_id for i, w in enumerate(batch) if i not in taking]
    predicted = price.one(step)
    batch_tokens = int(step[0] - base[0])
    return Selection(reference, budget, tuple(scheduled), tuple(parked), batch_tokens, room, predicted, carries_more)


Step = tuple[int, int, int, int]  # a step's tokens, resident context, attention pairs and requests


def _joined(step: Step, tokens: int, context: int) -> Step:
    """``step`` with one more request computing ``tokens`` after ``context`` cached ones."""
    return (step[0] + tokens, step[1] + context, step[2] + sequence_pairs(tokens, context), step[3] + 1)


def _thinned(online: t.Sequence[Work], totals: Step, concurrency_inflation: float) -> Step:
    """The online work as it would run alone: of its ``totals``, the decodes' part (one token each, and one request
    each) thinned by ι, the prompts' as it is."""
    decodes = _totals([w for w in online if w.tokens == 1])
    tokens, context, pairs, requests = (
        total - d + round(d / concurrency_inflation) for total, d in zip(totals, decodes, strict=True)
    )
    return tokens, context, pairs, requests


def _totals(work: t.Sequence[Work]) -> Step:
    tokens, context, pairs = _columns(work)
    return int(tokens.sum()), int(context.sum()), int(pairs.sum()), len(work)


def _columns(work: t.Sequence[Work]) -> tuple[Ints, Ints, Ints]:
    tokens = np.fromiter((w.tokens for w in work), dtype=np.int64, count=len(work))
    context = np.fromiter((w.context for w in work), dtype=np.int64, count=len(work))
    return tokens, context, tokens * context + tokens * (tokens + 1) // 2  # sequence_pairs, element by element


@dataclasses.dataclass(frozen=True)
class _Pricer:
    """T̂ plus the host's time, of steps at most τ tokens long (one past τ is priced at τ, and fails on τ)."""

    cost: StepCost
    host: HostTime
    max_tokens: int

    def seconds(self, steps: tuple[npt.ArrayLike, ...]) -> npt.NDArray[np.float64]:
        tokens, context, pairs, requests = (np.asarray(x, dtype=np.int64) for x in steps)
        forward = self.cost(np.minimum(tokens, self.max_tokens), context, pairs)
        return forward + self.host.per_step + self.host.per_request * requests

    def fit(self, steps: tuple[npt.ArrayLike, ...], budget: float) -> npt.NDArray[np.bool_]:
        """Which of the steps fit τ and the budget."""
        return (np.asarray(steps[0]) <= self.max_tokens) & (self.seconds(steps) <= budget)

    def one(self, step: Step) -> float:
        """One step; online demand over τ (prompts waiting) is priced at τ, the most a step takes."""
        return float(self.seconds(tuple(np.array([x], dtype=np.int64) for x in step))[0])

    def largest(self, step: Step, context: int, budget: float, most: int) -> int:
        """The most tokens k ≤ ``most`` that one more request over ``context`` adds to ``step`` within the budget;
        0 if not even one. Every k is priced at once."""
        if most <= 0:
            return 0
        k = np.arange(1, most + 1, dtype=np.int64)
        pairs = k * context + k * (k + 1) // 2  # sequence_pairs(k, context), for every k
        steps = (step[0] + k, np.full_like(k, step[1] + context), step[2] + pairs, np.full_like(k, step[3] + 1))
        ok = self.fit(steps, budget)
        return int(np.argmin(ok)) if not ok.all() else most  # the longest run of k that fits from 1
