"""T(P, C): how long one vLLM step takes on a named GPU, from first principles; and the twin's pacing.

A step computes P tokens that attend to C tokens already in the KV cache (summed over its requests)::

    T(P, C) = overhead + knee(W / B, 2·N·P / F) + K·(C + P) / B + 4·L·H·d·pairs / F

- W / B: every step streams the weights once (W bytes: all but the input embedding, whose rows are
  gathered), at the achieved bandwidth B; 2·N·P / F: the linear layers' FLOPs (N non-embedding
  parameters) at the achieved dense peak F. The linear layers take the smooth maximum of the two,
  ``knee(a, b) = (a^s + b^s)^(1/s)``: equal to the larger far from the knee P = W·F / (2·N·B), above it by
  2^(1/s) at the knee, so a token under the knee costs some of its FLOPs, as real GEMMs do. The sharpness s
  is fitted on measured H200 steps (``tidal bench calibrate``, docs/engine.md); s = inf is the hard roofline
  ``max(a, b)``, where tokens under the knee are free.
- K·(C + P) / B: attention reads the KV of every attended token (K bytes per token) and writes the new ones.
- 4·L·H·d·pairs / F: attention's FLOPs, QKᵀ and AV, over every (query, key) pair the step computes.
- overhead: the fixed host and launch cost of a step.

The profile's numbers and their sources are in ``twin_profiles.toml`` (docs/engine.md tabulates T).
Pure: no clock, no I/O (the twin's model reads its clock and sleeps; ``Pacer`` only decides how long).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import typing as t

import numpy as np
import numpy.typing as npt

GIB = 1 << 30
KV_BLOCK_TOKENS = 16  # vLLM's default block size: the pool is a whole number of blocks


TIME_SCALE_MARK = "*"  # MODEL@GPU*K: the profile time-scaled by K (Profile.time_scaled)


@dataclasses.dataclass(frozen=True)
class Profile:
    """A model on a GPU: the model's shape, the GPU's datasheet rates and the achieved fractions of them."""

    name: str
    params: float
    non_embedding_params: float
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    bytes_per_param: int
    memory_gib: float
    bandwidth_bytes_per_s: float
    peak_flops: float
    bandwidth_efficiency: float
    compute_efficiency: float
    step_overhead_s: float
    knee_sharpness: float
    memory_utilization: float
    activation_reserve_gib: float
    max_num_seqs: int
    max_num_batched_tokens: int = 2048

    @classmethod
    def from_tables(cls, name: str, model: t.Mapping[str, t.Any], gpu: t.Mapping[str, t.Any]) -> Profile:
        fields = {f.name for f in dataclasses.fields(cls)} - {"name"}
        values = {**model, **gpu}
        unknown, missing = set(values) - fields, fields - set(values) - {"max_num_batched_tokens"}
        if unknown or missing:
            raise ValueError(f"profile {name}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
        return cls(name=name, **values)

    @property
    def weight_bytes(self) -> float:
        """Bytes streamed per step: every weight but the input embedding table."""
        return (self.params - self.vocab_size * self.hidden_size) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param

    def time_scaled(self, k: float) -> Profile:
        """The same GPU k times slower: every step takes k × T(P, C) exactly (the form is homogeneous in its
        seconds), the knee and the KV pool unchanged. For ``tidal bench frontier --time-scale``: a CPU that cannot
        pace a fast GPU's steps paces them stretched."""
        return dataclasses.replace(
            self,
            name=f"{self.name}{TIME_SCALE_MARK}{k:g}",
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s / k,
            peak_flops=self.peak_flops / k,
            step_overhead_s=self.step_overhead_s * k,
        )

    @property
    def bandwidth(self) -> float:
        return self.bandwidth_bytes_per_s * self.bandwidth_efficiency

    @property
    def flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def knee_tokens(self) -> float:
        """Tokens a step computes where the linear layers' FLOPs take as long as streaming the weights."""
        return self.weight_bytes / self.bandwidth * self.flops / (2 * self.non_embedding_params)

    @property
    def kv_pool_tokens(self) -> int:
        """Tokens vLLM's KV pool holds on this GPU: what is left of its memory share after weights and activations."""
        free = self.memory_gib * GIB * self.memory_utilization - self.params * self.bytes_per_param
        free -= self.activation_reserve_gib * GIB
        blocks = int(free // (self.kv_bytes_per_token * KV_BLOCK_TOKENS))
        return max(blocks, 0) * KV_BLOCK_TOKENS


def step_seconds(profile: Profile, num_tokens: int, context: int, attention_pairs: int) -> float:
    """T(P, C): one step of ``num_tokens`` computed over ``context`` cached tokens, ``attention_pairs`` (query, key) pairs."""
    if num_tokens <= 0:
        return 0.0
    linear = smooth_max(
        profile.weight_bytes / profile.bandwidth,
        2 * profile.non_embedding_params * num_tokens / profile.flops,
        profile.knee_sharpness,
    )
    kv_read = profile.kv_bytes_per_token * (context + num_tokens) / profile.bandwidth
    attention = 4 * profile.num_layers * profile.num_heads * profile.head_dim * attention_pairs / profile.flops
    return profile.step_overhead_s + linear + kv_read + attention


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """T(P, C, pairs) = table[P] + per_context·C + per_pair·pairs, read off ``step_seconds`` (the form is separable:
    overhead + linear layers(P) + K·(C + P) ÷ B + attention(pairs)), so that many steps are priced at once: the
    oracle's, and the relative budget's every prefix of a step (step_budget.py)."""

    table: npt.NDArray[np.float64]  # index P; entry 0 is one token's step, so that interpolation stays on the form
    per_context: float
    per_pair: float

    @classmethod
    def of(cls, profile: Profile, max_tokens: int) -> StepCosts:
        table = np.array([step_seconds(profile, max(p, 1), 0, 0) for p in range(max_tokens + 1)])
        base, far = step_seconds(profile, 1, 0, 0), 1_000_000
        per_context = (step_seconds(profile, 1, far, 0) - base) / far
        per_pair = (step_seconds(profile, 1, 0, far) - base) / far
        return cls(table, per_context, per_pair)

    def tokens(self, p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The table at fractional token counts: alternating steps of the neighbouring whole counts."""
        if np.any(p > len(self.table) - 1):
            raise ValueError("step longer than the table")
        return np.interp(p, np.arange(len(self.table)), self.table)

    def seconds(
        self, tokens: npt.NDArray[np.int64], context: npt.NDArray[np.int64], pairs: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """``step_seconds`` of whole steps, element by element (0 for a step of no token)."""
        if np.any(tokens > len(self.table) - 1):
            raise ValueError("step longer than the table")
        priced = self.table[tokens] + self.per_context * context + self.per_pair * pairs
        out: npt.NDArray[np.float64] = np.where(tokens > 0, priced, 0.0)
        return out


def smooth_max(a: float, b: float, sharpness: float) -> float:
    """(a^s + b^s)^(1/s) for a, b >= 0, written so that s = inf gives max(a, b) exactly."""
    high, low = max(a, b), min(a, b)
    if high == 0.0:
        return 0.0
    return high * float((1.0 + (low / high) ** sharpness) ** (1.0 / sharpness))


def sequence_pairs(query_len: int, context: int) -> int:
    """Causal (query, key) pairs of one request computing ``query_len`` tokens after ``context`` cached ones."""
    return query_len * context + query_len * (query_len + 1) // 2


def decode_seconds(profile: Profile, num_seqs: int, context_per_seq: int) -> float:
    """A decode step: ``num_seqs`` requests, one token each, every one after ``context_per_seq`` cached tokens."""
    pairs = num_seqs * sequence_pairs(1, context_per_seq)
    return step_seconds(profile, num_seqs, num_seqs * context_per_seq, pairs)


def prefill_seconds(profile: Profile, num_tokens: int, context: int = 0) -> float:
    """A prefill step: one request's chunk of ``num_tokens`` after ``context`` of its own tokens already cached."""
    return step_seconds(profile, num_tokens, context, sequence_pairs(num_tokens, context))


@dataclasses.dataclass
class Pacer:
    """How long the twin's forward sleeps so that the whole step, not only forward(), takes T(P, C).

    A step is forward() plus the engine's own work outside it (scheduling, input preparation, sampling,
    output processing). That outside time is estimated from the gaps between one forward's end and the next
    one's start over the last ``window`` steps. A gap can also hold the engine waiting for requests, which
    only ever lengthens it: gaps above ``idle_gap_s`` are left out, and the estimate is the lower quartile,
    which stays on working gaps while up to three in four of the window's gaps held a wait. A step whose
    forward plus outside time already exceeds its target cannot be slowed down to it: it is counted in
    ``overruns``.
    """

    window: int = 16
    idle_gap_s: float = 0.25
    steps: int = 0
    overruns: int = 0
    _gaps: collections.deque[float] = dataclasses.field(default_factory=collections.deque)

    def observe_gap(self, gap_s: float) -> None:
        if 0.0 <= gap_s <= self.idle_gap_s:
            self._gaps.append(gap_s)
            if len(self._gaps) > self.window:
                self._gaps.popleft()

    @property
    def outside_s(self) -> float:
        if len(self._gaps) < 2:
            return self._gaps[0] if self._gaps else 0.0
        return statistics.quantiles(self._gaps, n=4, method="inclusive")[0]

    def sleep_seconds(self, target_s: float, forward_s: float) -> float:
        """Seconds to sleep after a forward of ``forward_s`` in a step whose target is ``target_s``."""
        self.steps += 1
        sleep = target_s - forward_s - self.outside_s
        if sleep < 0.0:
            self.overruns += 1
            return 0.0
        return sleep
