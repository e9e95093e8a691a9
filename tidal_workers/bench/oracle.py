"""H*(α): the most steady-state batch tokens/s any scheduler can add beside an online load at a latency budget α.

The budget: every step may take at most α times the same step with its online work alone, where online is served
as vLLM serves it alone (a decode step of its n₀ decoding requests; a prompt step of those plus one whole online
prompt). Batch prefill and decode tokens may go into any step; a parked batch request costs nothing. The model is a
fluid steady state (issue 35; the derivation is ../shared/research/harvest-oracle.md):

- Online requests arrive at λ a second; n of them decode at once, so there are k = λ·(decodes ÷ n − 1) decode steps
  and λ prompt steps a second (Little's law: every step advances all n). Alone, n = n₀ fills the second exactly.
  Batch work lengthens the steps, so n grows; the solver scans n from n₀ up to where a step would break the budget.
- For each n: batch tokens per decode step x_d and per prompt step x_p, of which d_d, d_p decode (at most the free
  slots, S − n, and τ − n tokens a step); steady state: batch prefill = decodes × prompt ÷ (output − 1); the steps
  of each kind stay within α times their alone time on average (a prompt step's budget pooled over prompt sizes,
  its batch tokens charged as beside the mean online prompt, as in the note); time is conserved (the steps fill
  the second; a step may idle within its budget).
- A step's time is ``step_time.step_seconds``, read as a table over its token count P plus exact per-context and
  per-pair slopes (the form is separable: overhead + linear layers(P) + K·(C + P) ÷ B + attention(pairs)). The table
  is interpolated between whole token counts, which is what alternating steps of ⌊x⌋ and ⌈x⌉ tokens achieves.

How it is solved, with no LP library: the linear layers' time is convex in P (``smooth_max`` with sharpness ≥ 1,
or the hard max), so the program is convex. For a given n and batch decode rate D, the only free choices are how
many batch tokens go into decode steps (x_d; the rest go into prompt steps) and how the decodes split between
the two kinds; the split is an interval found in closed form, and the feasibility margin is concave in x_d, so a
golden-section search decides whether D fits; bisection finds the largest D. Vectorized over a grid of n (refined
around its best point). In the hard-knee limit this is the note's linear program, which splits the linear layers
into a free part under the knee and 2N/F above: the two agree within 1.2 % once the note's scan of n is fine
enough (tests/workers/bench/test_oracle.py).

Also here: the any-latency bound (every token costs at least its 2N/F, its KV traffic and its attention, the chat
template counted) and the all-slots steady ceiling. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing as t

import numpy as np

from tidal_engine.step_time import Profile
from tidal_engine.step_time import StepCosts
from tidal_engine.step_time import step_seconds
from tidal_workers.bench.workload import Lengths

# The chat template around a one-message prompt on the twin's byte-level tokenizer (tidal_engine/tiny.py):
# <|im_start|> "user\n" ... <|im_end|> "\n" <|im_start|> "assistant\n" = 1 + 5 + 2 + 1 + 10 tokens.
TEMPLATE_TOKENS = 19
GRID = 160  # online concurrencies scanned, then as many again around the best
ITERATIONS = 48  # bisection on the batch rate and golden section on the split; both to ~1e-4 or finer


def length_distribution(lengths: Lengths) -> tuple[np.ndarray, np.ndarray]:
    """Lengths's exact distribution: the log-normal rounded to whole tokens, its tails piled on low and high."""
    sizes = np.arange(lengths.low, lengths.high + 1)
    edges = np.log(np.concatenate([sizes - 0.5, [lengths.high + 0.5]]))
    z = (edges - math.log(lengths.median)) / (lengths.sigma * math.sqrt(2))
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z))
    cdf[0], cdf[-1] = 0.0, 1.0
    return sizes.astype(float), np.diff(cdf)


@dataclasses.dataclass(frozen=True)
class RequestClass:
    """A request class's means, prompt and output lengths drawn independently, the chat template in the prompt."""

    prompt: float
    output: float
    decode_context: float  # mean context a decode token attends to (the mean resident size while decoding)
    prompt_pairs: float  # mean causal (query, key) pairs of one prompt, however it is chunked
    prompt_sizes: np.ndarray
    prompt_weights: np.ndarray

    @classmethod
    def of(cls, prompt: Lengths, output: Lengths) -> RequestClass:
        p, wp = length_distribution(prompt)
        p = p + TEMPLATE_TOKENS
        o, wo = length_distribution(output)
        dec = o - 1  # the first token comes with the prefill
        mean_p, mean_dec = float(p @ wp), float(dec @ wo)
        context = (mean_dec * mean_p + float((dec * (dec + 1) / 2) @ wo)) / mean_dec
        return cls(mean_p, float(o @ wo), context, float((p * (p + 1) / 2) @ wp), p, wp)

    @property
    def decodes(self) -> float:
        return self.output - 1


@dataclasses.dataclass(frozen=True)
class Oracle:
    alpha: float
    batch_tokens_per_s: float  # H*(α): batch generated tokens a second (first tokens included)
    online_alone: float  # n₀: online requests decoding at once with no batch work
    online_concurrency: float  # n at the optimum
    decode_step_s: float  # the online-alone decode step, T_d(n₀)
    prompt_step_s: float  # the online-alone prompt step, mean over online prompts


class _Online:
    """The online load's steps as functions of its concurrency n (arrays), on one profile."""

    def __init__(self, rate: float, online: RequestClass, costs: StepCosts):
        self.rate, self.online, self.costs = rate, online, costs
        # Prompt steps: the table shifted by each online prompt size, weighted by its probability.
        span = len(costs.table) - int(online.prompt_sizes.max()) - 1
        shifted = np.zeros(span)
        for size, weight in zip(online.prompt_sizes.astype(int), online.prompt_weights, strict=True):
            shifted += weight * costs.table[size : size + span]
        self.prompt_table = StepCosts(shifted, costs.per_context, costs.per_pair)

    def decoding_terms(self, n: np.ndarray) -> np.ndarray:
        """KV reads and attention of n online decodes."""
        c = self.online.decode_context
        return self.costs.per_context * n * c + self.costs.per_pair * n * (c + 1)

    def decode_step(self, n: np.ndarray) -> np.ndarray:
        return self.costs.tokens(n) + self.decoding_terms(n)

    def prompt_step(self, n: np.ndarray) -> np.ndarray:
        return self.prompt_table.tokens(n) + self.decoding_terms(n) + self.costs.per_pair * self.online.prompt_pairs

    def decode_steps_per_s(self, n: np.ndarray) -> np.ndarray:
        return self.rate * (self.online.decodes / n - 1)

    def busy(self, n: np.ndarray) -> np.ndarray:
        """Seconds a second the online steps take alone at concurrency n."""
        return self.rate * self.prompt_step(n) + self.decode_steps_per_s(n) * self.decode_step(n)


def _bisect(lo: float, hi: float, fits: t.Callable[[float], bool]) -> float:
    """The largest x in [lo, hi] with fits(x), for a fits that holds up to a point and not beyond."""
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def harvest_oracle(
    profile: Profile,
    rate: float,
    online: RequestClass,
    batch: RequestClass,
    alpha: float,
    *,
    prompt_step_prefill: bool = True,
) -> Oracle:
    """H*(α) on ``profile`` beside ``rate`` online requests/s (module docstring). ``prompt_step_prefill`` False: no
    batch prefill in a step with an online prompt, only batch decodes, as TidalScheduler runs them (vLLM's loop
    schedules running requests before waiting ones, so a batch chunk there would take the online prompt's tokens)."""
    if alpha < 1:
        raise ValueError("alpha is a step's allowed inflation: at least 1")
    tau, slots = profile.max_num_batched_tokens, profile.max_num_seqs
    costs = StepCosts.of(profile, 2 * tau + int(online.prompt_sizes.max()) + 1)
    steps = _Online(rate, online, costs)
    top = min(online.decodes, slots, tau) * (1 - 1e-9)  # k > 0; a step holds its n decodes
    if steps.busy(np.array(top)) >= 1.0:
        raise ValueError(f"{rate} online requests/s alone do not fit on {profile.name}")
    n0 = _bisect(0.5, top, lambda n: float(steps.busy(np.array(n))) >= 1.0)  # busy falls as n grows
    td0, tp0 = float(steps.decode_step(np.array(n0))), float(steps.prompt_step(np.array(n0)))

    def within(n: float) -> bool:
        return bool(steps.decode_step(np.array(n)) <= alpha * td0 and steps.prompt_step(np.array(n)) <= alpha * tp0)

    n_max = top if within(top) else _bisect(n0, top, within)
    grid = np.linspace(n0, n_max, GRID)
    best = _batch_decodes(steps, batch, profile, alpha, td0, tp0, grid, prompt_step_prefill)
    i = int(np.argmax(best))
    fine = np.linspace(grid[max(i - 1, 0)], grid[min(i + 1, GRID - 1)], GRID)
    fine_best = _batch_decodes(steps, batch, profile, alpha, td0, tp0, fine, prompt_step_prefill)
    j = int(np.argmax(fine_best))
    decodes, n = (fine_best[j], fine[j]) if fine_best[j] >= best[i] else (best[i], grid[i])
    return Oracle(alpha, float(decodes) * batch.output / batch.decodes, n0, float(n), td0, tp0)


def _batch_decodes(
    steps: _Online,
    batch: RequestClass,
    profile: Profile,
    alpha: float,
    td0: float,
    tp0: float,
    n: np.ndarray,
    prompt_step_prefill: bool,
) -> np.ndarray:
    """The most batch decode tokens/s at each online concurrency n (0 where n is no steady state under α)."""
    rate, costs = steps.rate, steps.costs
    mean_prompt = steps.online.prompt  # batch tokens in a prompt step are charged as beside the mean online prompt
    k = steps.decode_steps_per_s(n)
    room_d = alpha * td0 - steps.decode_step(n)  # per decode step; inf when alpha is
    room_p = alpha * tp0 - steps.prompt_step(n)
    free_time = 1.0 - steps.busy(n)
    valid = (room_d >= 0) & (room_p >= 0) & (free_time >= 0) & (free_time <= k * room_d + rate * room_p)
    ratio = batch.prompt / batch.decodes  # prefill tokens per decode token, steady state
    prefill_extra = costs.per_pair * batch.prompt_pairs / batch.prompt  # beyond the table's P-terms
    decode_extra = costs.per_context * batch.decode_context + costs.per_pair * (batch.decode_context + 1)
    swap = decode_extra - prefill_extra  # > 0: a decode attends to its whole prompt, a prefill token to half
    free_slots = profile.max_num_seqs - n
    cap = profile.max_num_batched_tokens - n  # batch tokens a step can take
    base_d, base_p = costs.tokens(n), costs.tokens(n + mean_prompt)

    def margin(decodes: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        """>= 0 iff ``decodes`` batch decodes/s fit with x_d batch tokens in each decode step."""
        tokens = (1 + ratio) * decodes
        x_p = (tokens - k * x_d) / rate
        g_d = costs.tokens(n + x_d) - base_d
        g_p = costs.tokens(n + mean_prompt + x_p) - base_p
        with np.errstate(invalid="ignore"):  # inf - inf cannot occur: rooms are inf only together
            decode_room = (room_d - g_d - prefill_extra * x_d) / swap
            prompt_room = (room_p - g_p - prefill_extra * x_p) / swap
        high = np.minimum(k * np.minimum(np.minimum(x_d, free_slots), decode_room), decodes)
        if prompt_step_prefill:
            low = np.maximum(0.0, decodes - rate * np.minimum(np.minimum(x_p, free_slots), prompt_room))
            decodes_only = np.inf
        else:  # a prompt step's x_p batch tokens are all decodes
            low = decodes - rate * x_p
            decodes_only = rate * (np.minimum(free_slots, prompt_room) - x_p)
        busy = k * g_d + rate * g_p + prefill_extra * tokens + swap * decodes
        return np.minimum(np.minimum(high - low, free_time - busy), decodes_only)

    def fits(decodes: np.ndarray) -> np.ndarray:
        tokens = (1 + ratio) * decodes
        a = np.clip((tokens - rate * cap) / k, 0.0, cap)
        b = np.minimum(tokens / k, cap)
        ok = a <= b
        inv = (math.sqrt(5) - 1) / 2
        c, d = b - inv * (b - a), a + inv * (b - a)
        mc, md = margin(decodes, c), margin(decodes, d)
        for _ in range(ITERATIONS):  # golden section: the margin is concave in x_d
            left = mc >= md
            a, b = np.where(left, a, c), np.where(left, d, b)
            c, d = np.where(left, b - inv * (b - a), d), np.where(left, c, a + inv * (b - a))
            new = margin(decodes, np.where(left, c, d))
            mc, md = np.where(left, new, md), np.where(left, mc, new)
        return ok & (margin(decodes, (a + b) / 2) >= -1e-12)

    lo = np.zeros_like(n)
    hi = np.where(valid, np.minimum((k + rate) * free_slots, free_time / (prefill_extra * ratio + decode_extra)), 0.0)
    hi = np.maximum(hi, 0.0)
    for _ in range(ITERATIONS):
        mid = (lo + hi) / 2
        ok = fits(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return np.where(valid, lo, 0.0)


def any_latency_bound(profile: Profile, rate: float, online: RequestClass, batch: RequestClass) -> float:
    """Batch generated tokens/s when every token costs only its 2N/F, its KV traffic and its attention.

    No step overhead, no weight read: an upper bound for any scheduler at any latency (H*(∞) is below it).
    """
    costs = StepCosts.of(profile, 1)
    per_token = 2 * profile.non_embedding_params / profile.flops + costs.per_context  # FLOPs and its KV write

    def seconds(request: RequestClass) -> float:
        decode_reads = request.decodes * (costs.per_context + costs.per_pair) * request.decode_context
        attention = costs.per_pair * (request.prompt_pairs + request.decodes)
        return (request.prompt + request.decodes) * per_token + decode_reads + attention

    return max(1.0 - rate * seconds(online), 0.0) * batch.output / seconds(batch)


def steady_ceiling(profile: Profile, batch: RequestClass) -> float:
    """Batch generated tokens/s with every slot batch, in steady state (slots or KV pool, and τ, the limits)."""
    resident = min(profile.max_num_seqs, profile.kv_pool_tokens / batch.decode_context)
    decodes = resident * batch.decodes / (batch.decodes + 1)  # one step of each request's life is its prefill
    ratio = batch.prompt / batch.decodes
    decodes = min(decodes, profile.max_num_batched_tokens / (1 + ratio))
    tokens = decodes * (1 + ratio)
    pairs = decodes * (batch.decode_context + 1) + decodes / batch.decodes * batch.prompt_pairs
    step = step_seconds(profile, round(tokens), round(decodes * batch.decode_context), round(pairs))
    return decodes * batch.output / batch.decodes / step


def profile_hash(profile: Profile) -> str:
    """The first 12 hex digits of the SHA-256 of the profile's fields: names the exact profile a figure used."""
    fields = json.dumps(dataclasses.asdict(profile), sort_keys=True)
    return hashlib.sha256(fields.encode()).hexdigest()[:12]
