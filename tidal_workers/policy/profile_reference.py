"""The latency gate's reference from the engine's profile: the online-alone inter-token latency that the step-time
form T(P, C) (``tidal_engine/step_time.py``) predicts at the online load the engine is serving, levelled by what
the engine measures.

Why not the fit alone (inflation.py's ``ItlFit``): its intercept extrapolates ITL from a working set of 6-16 down
to none, and a period's mean ITL swings ±10-15 %, so the intercept walked several per cent as forgetting replaced
readings (on the A6000 twin at 5/s every fitted window drifted 24-54 %). Why not the profile alone: a fluid model of
the steps misses what the engine adds (Poisson bursts of prompts, the host's own time), and on the twin its
online-alone ITL read 4 % under the measured one at 5/s; at α_set 1.2 that is a fifth of the budget.

So the profile gives the shape and the engine the level. Each period:

- The online load is what the engine finished less what this node finished (vLLM's ``request_prompt_tokens`` and
  ``request_generation_tokens`` histograms, both observed as a request finishes, against the node's own count of
  the same; ``own_requests.py``): requests a second and their mean prompt and output, as forgetting sums.
- ``mean_gap`` solves the steady state of the steps (Little's law, as the oracle does,
  tidal_workers/bench/oracle.py) for that online load beside the node's batch: O requests decoding at their mean
  context, and the prompt tokens the node had computed landing a chunk at a time (128 tokens when staged: the
  smooth knee makes a lump cost more than its share, and spread evenly the model missed a fifth of the batch's
  cost). It returns the mean step, which on a stock vLLM is the mean ITL (every running request gets one token a
  step).
- The level is the forgetting mean of measured ITL ÷ ``mean_gap`` at the period's own batch and the last ~10 s of
  online load: every reading informs it, at whatever working set, with no extrapolation to O = 0.
- The reference is level × ``mean_gap`` with no batch.
- A rise of the online rate is priced within a few periods: finished requests tell it only as they finish, and
  the long sums follow over ~1/(1 − ``LOAD_FORGET``) periods, so on a step from 1 to 8 requests a second the load
  was priced at 1.3/s 12 s after it, and the batch the gate had kept for 1/s held the online gaps at 1.2-1.4× for
  ~40 s (docs/results/2026-12-07-latency-gate-alpha-115, step-light/). The engine counts each request's first token
  as it comes (vLLM's TTFT histogram), a step or so after it arrives; less the requests this node sent, that is
  the online arrivals, summed over ~100 s for the rate the profile is priced at, and over ~3 s
  (``ARRIVAL_FORGET``). When the 3-s sums read over the priced rate by more than their noise (``RISE_SIGMAS``
  Poisson standard errors) two periods running, the long ones start again from that period's arrivals; while they
  read over the recent finishes' rate, the level is not read (the load it reads ITL against is the one in doubt).
  The mean prompt and output are still the finishes'. A fall is priced as the long sums follow it: the safe side.

With the profile the gate also steers on it (aimd.py): the inflation its target moves on is the profile's at the
working set, ``inflation`` (model with the batch ÷ model without: the level cancels), and O* is where that reaches
α_set, ``budget``. A period's measured ITL swings with the online prompts that land in it (±3 % over 20 s at 8/s,
where the batch's whole share at α_set 1.2 is a fifth of the step), and moved a working set of ~10 between 2 and 17
(docs/results/2026-12-06-latency-gate-profile); the profile's inflation moves only with the load's sums. Replayed
over those windows it was within ~1 % of the inflation the online requests saw. The measured inflation still
rules when it reads ``inflation.GUARD`` over α_set (a step of the online load the sums have not followed).

The model errs where its slope does: a batch decode that costs more than the profile says is not seen while the
measured inflation stays under the guard, and the gate then holds more than α_set allows (measured,
docs/benchmarks.md).

Pure: readings in, seconds out.
"""

from __future__ import annotations

import dataclasses
import math
import typing as t

from tidal_engine.step_time import Profile
from tidal_engine.step_time import step_seconds

LOAD_FORGET = 0.99  # per period: the online load remembers ~100 s (~500 requests at 5/s: rate ±3 %, r ±1.3 %)
RECENT_FORGET = 0.9  # per period: the load that caused this period's ITL, ~10 s, which the level reads against
LEVEL_FORGET = 0.998  # per reading: ~500 periods (a calibration, not a signal)
BISECTIONS = 60
BUDGET_BISECTIONS = 20  # on O*: to a ten-thousandth of the engine's ceiling
MIN_REQUESTS = 20.0  # a load's means are read from this many requests' weight at least (~4 s at 5/s)
ARRIVAL_FORGET = 0.7  # per period: the online arrivals remember ~3 s (a step 1 → 8/s reads 5.6/s 3 s after it)
# A rise is the arrivals' rate over the long sums' by this many of its Poisson standard errors (1 ÷ √requests),
# two periods running: at 5/s the arrivals' weighted count is ~17, whose rate swings ±19 % (the weights' squares),
# so 3.5 errors (85 %) is ~4.5 of its swings; the node's sends, counted a period before their first tokens now and
# then, add swings of their own that the second period mostly cancels (scripted, slips of up to 3 sends a period:
# 3 false rises in 20,000 periods at 1/s, none at 5 or 8/s; 52, 4 and 2 on one period). A step from 1 to 8/s
# passes it in its first two periods (~10 requests at 3.1/s against 2.1/s, then ~15 at 4.6/s).
RISE_SIGMAS = 3.5
MIN_ARRIVALS = 8.0  # fewer arrivals' weight than this tells no rise (a 1/s load's bursts reach 5)
# A period whose ITL the model misses by this factor either way is a counting slip (the node's requests counted a
# scrape before or after the engine's), not news of the level: it is left out.
MAX_SLIP = 2.0


@dataclasses.dataclass(frozen=True)
class Work:
    """Requests finished, as forgetting sums over periods: their number, prompt and generated tokens, and the
    seconds they were counted over."""

    seconds: float = 0.0
    requests: float = 0.0
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0

    def add(self, seconds: float, requests: float, prompt_tokens: float, output_tokens: float, forget: float) -> Work:
        f = forget
        return Work(
            f * self.seconds + seconds,
            f * self.requests + requests,
            f * self.prompt_tokens + prompt_tokens,
            f * self.output_tokens + output_tokens,
        )

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def prompt(self) -> float:
        return self.prompt_tokens / self.requests if self.requests > 0 else 0.0

    @property
    def output(self) -> float:
        return self.output_tokens / self.requests if self.requests > 0 else 0.0

    def at_rate(self, rate: float) -> Work:
        """This load's requests (their mean prompt and output) arriving at ``rate`` a second."""
        scale = rate * self.seconds / self.requests if self.requests > 0 else 0.0
        return Work(self.seconds, scale * self.requests, scale * self.prompt_tokens, scale * self.output_tokens)


@dataclasses.dataclass(frozen=True)
class Batch:
    """The node's batch work at the engine in one period: requests decoding, their mean context, and the prompt
    tokens a second it had the engine compute (staged warm-ups' chunks, the unwarmed rest of each prompt)."""

    decoding: float = 0.0
    context: float = 0.0
    prefill_per_s: float = 0.0
    chunk: float = 0.0  # the prompt tokens one batch prefill lands in a step with (a staged chunk, or a whole prompt)


def mean_gap(profile: Profile, online: Work, batch: Batch = Batch()) -> float | None:
    """The mean step in seconds with ``online``'s load (its rate, mean prompt and output) beside ``batch``: the
    concurrency n of online decodes at which the steps fill each second, then 1 ÷ steps a second. None where there
    is no online decode to time, or the load does not fit the engine (then no step time is steady)."""
    rate, prompt, decodes = online.rate, online.prompt, online.output - 1  # the first token comes with the prefill
    if rate <= 0 or decodes <= 0 or prompt < 0:
        return None
    context = prompt + online.output / 2  # the mean resident size of a decoding online request

    def busy(n: float) -> float:
        """Seconds a second the steps take at online concurrency n (Little's law: every step advances all n)."""
        steps = rate * decodes / n
        share = min(1.0, batch.prefill_per_s / (steps * batch.chunk)) if batch.chunk > 0 else 0.0
        seconds = 0.0
        for chunk, weight in ((0, 1 - share), (batch.chunk, share)):  # steps without and with a batch chunk
            tokens = n + batch.decoding + chunk
            cached = round(n * context + batch.decoding * batch.context + (batch.context if chunk else 0))
            pairs = n * (context + 1) + batch.decoding * (batch.context + 1) + chunk * batch.context
            # at least a token: under half a decode a second, a step of none would cost nothing, and busy would
            # fall again as n does (the bisection then settled on a gap of microseconds)
            decode = step_seconds(profile, max(1, round(tokens)), cached, round(pairs))
            with_prompt = step_seconds(
                profile, round(tokens + prompt), cached, round(pairs + prompt * (prompt + 1) / 2)
            )
            seconds += weight * (rate * with_prompt + (steps - rate) * decode)
        return seconds

    top = decodes * (1 - 1e-9)  # above decodes, fewer steps a second than prompts: no steady state
    if busy(top) >= 1.0:
        return None
    # busy falls as n grows (fewer, slightly longer steps): n is where it reaches one
    _, n = _bisect(1e-3, top, lambda n: busy(n) >= 1.0, BISECTIONS)
    return n / (rate * decodes)


def _bisect(lo: float, hi: float, holds: t.Callable[[float], bool], iterations: int) -> tuple[float, float]:
    """The interval [lo, hi] narrowed around where ``holds`` (true at lo, false at hi) stops holding."""
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo, hi


@dataclasses.dataclass(frozen=True)
class ProfileReference:
    """The forgetting sums the reference is read from: the online load, long (for the reference) and recent (for
    the level), and the level (measured ÷ modelled ITL).

    The level reads each ITL against the recent load, the one that caused it: read against the long mean, a step of
    the online rate (5 → 8/s) made ITL rise ahead of the model for ~100 periods, the level took that for the
    model's error, and the reference overshot its new value by 3 %."""

    online: Work = Work()
    recent: Work = Work()
    arriving: Work = Work()  # online requests given their first token (seconds and requests only), long
    arrivals: Work = Work()  # and the same over ~3 s
    rising: bool = False  # the ~3-s arrivals read over the priced rate by their noise last period
    level_sum: float = 0.0
    level_weight: float = 0.0
    batch: Batch = Batch()  # the last period's, for its requests' context and the chunk their prompts land in
    prefill_sum: float = 0.0  # forgetting sums of the batch's computed prompt tokens a second and its decoding
    decoding_sum: float = 0.0  # requests: their ratio is one batch request's prefill a second

    def add(
        self, profile: Profile, online_finished: Work, batch: Batch, itl: float | None, arrived: float | None = None
    ) -> ProfileReference:
        """One period: ``online_finished`` (one period's counts, not sums) and the ``arrived`` online requests (None:
        not read) into the loads, then the period's ITL, if a token was timed, into the level at the period's batch,
        unless the load is rising."""
        counts = (online_finished.seconds, online_finished.requests)
        tokens = (online_finished.prompt_tokens, online_finished.output_tokens)
        f = LOAD_FORGET
        new = dataclasses.replace(
            self,
            online=self.online.add(*counts, *tokens, forget=f),
            recent=self.recent.add(*counts, *tokens, forget=RECENT_FORGET),
            batch=batch,
            prefill_sum=f * self.prefill_sum + batch.prefill_per_s,
            decoding_sum=f * self.decoding_sum + batch.decoding,
        )
        if arrived is not None:
            new = new._arrived(counts[0], arrived)
        # the level reads ITL against the recent finishes' load: not while arrivals say it has moved past them
        enough = itl is not None and new.recent.requests >= MIN_REQUESTS and not new._arrivals_over(new.recent.rate)
        modelled = mean_gap(profile, new.recent, batch) if enough else None
        if itl is None or modelled is None or not 1 / MAX_SLIP <= itl / modelled <= MAX_SLIP:
            return new
        g = LEVEL_FORGET
        return dataclasses.replace(
            new, level_sum=g * self.level_sum + itl / modelled, level_weight=g * self.level_weight + 1
        )

    def _arrived(self, seconds: float, arrived: float) -> ProfileReference:
        """A period's online arrivals into their sums; on a rise (two periods running), the long ones start again
        from this period's."""
        arrivals = self.arrivals.add(seconds, arrived, 0, 0, ARRIVAL_FORGET)
        arriving = self.arriving.add(seconds, arrived, 0, 0, LOAD_FORGET)
        new = dataclasses.replace(self, arrivals=arrivals, arriving=arriving)
        over = new._arrivals_over(self.rate)
        if over and self.rising:
            return dataclasses.replace(new, arriving=Work(seconds, arrived), rising=False)
        return dataclasses.replace(new, rising=over)

    @property
    def rate(self) -> float:
        """The online requests a second the profile is priced at: the long arrivals' where read, else the finishes'."""
        return self.arriving.rate if self.arriving.rate > 0 else self.online.rate  # (a slip can read under none)

    @property
    def load(self) -> Work:
        """The online load the profile is priced at: the finished requests' prompt and output at ``rate``."""
        return self.online.at_rate(self.rate)

    def _arrivals_over(self, rate: float) -> bool:
        """The online arrivals read over ``rate`` by more than their noise."""
        n = self.arrivals.requests
        return n >= MIN_ARRIVALS and self.arrivals.rate > rate * (1 + RISE_SIGMAS / math.sqrt(n))

    @property
    def level(self) -> float | None:
        return self.level_sum / self.level_weight if self.level_weight > 0 else None

    def reference(self, profile: Profile) -> float | None:
        """The online-alone ITL in seconds: the level times the profile's step with the online load alone."""
        alone = self._alone(profile)
        return None if alone is None or self.level is None else self.level * alone

    def inflation(self, profile: Profile, working_set: float) -> float | None:
        """The profile's inflation with ``working_set`` batch requests beside the online load: its step with them
        over its step without (the level is in both, so it cancels). None while the load is not known."""
        alone = self._alone(profile)
        return None if alone is None else self._over(profile, alone, working_set)

    def budget(self, profile: Profile, alpha_set: float, most: float) -> float | None:
        """O*, the most batch requests (up to ``most``) at which the profile's inflation stays within ``alpha_set``;
        None while the load is not known."""
        alone = self._alone(profile)
        return None if alone is None else self._budget(profile, alone, alpha_set, most)

    def steering(
        self, profile: Profile, working_set: float, alpha_set: float, most: float
    ) -> tuple[float, float] | None:
        """``inflation`` at ``working_set`` and ``budget``, the online-alone step solved once for both (the gate asks
        for the pair every period); None while the load is not known or the working set would not fit."""
        alone = self._alone(profile)
        over = None if alone is None else self._over(profile, alone, working_set)
        return None if alone is None or over is None else (over, self._budget(profile, alone, alpha_set, most))

    def _budget(self, profile: Profile, alone: float, alpha_set: float, most: float) -> float:
        def within(o: float) -> bool:  # every probe of O divides by the same step, ``alone``
            return (self._over(profile, alone, o) or math.inf) <= alpha_set

        return most if within(most) else _bisect(0.0, most, within, BUDGET_BISECTIONS)[0]

    def _alone(self, profile: Profile) -> float | None:
        return mean_gap(profile, self.load) if self.online.requests >= MIN_REQUESTS else None

    def _over(self, profile: Profile, alone: float, working_set: float) -> float | None:
        """The step with ``working_set`` batch requests over ``alone``; None where the load would not fit."""
        with_batch = mean_gap(profile, self.load, self._batch(working_set))
        return None if with_batch is None else with_batch / alone

    def _batch(self, working_set: float) -> Batch:
        """``working_set`` requests of the batch the node has been running, each prefilling as they have."""
        per_request = self.prefill_sum / self.decoding_sum if self.decoding_sum > 0 else 0.0
        return dataclasses.replace(self.batch, decoding=working_set, prefill_per_s=working_set * per_request)
