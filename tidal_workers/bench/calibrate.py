"""`tidal bench calibrate`: time a 7B-class transformer stack on a GPU over steps of known shape; fit a measured profile.

PyTorch only, random weights built on the device (nothing downloaded): the profile's model shape (layers,
heads, KV heads, head size, hidden and MLP sizes from its config.json) run as one engine step would run it
for each step of ``GRID`` (the twin's grid, prefill chunks, and prefill chunks beside decodes across the knee) —
the linear layers over all the step's tokens, attention of each part over its cached context
(``scaled_dot_product_attention`` with grouped KV heads), the output layer on each sequence's last token. On
CUDA each step is captured in a CUDA graph, as vLLM runs its decode steps, and timed by CUDA events. What it
leaves out: rotary embeddings and sampling (elementwise, small), and vLLM's host-side work per step, which the
profile's ``step_overhead_s`` stands for and a stack cannot measure.

The fit keeps the profile's functional form (``step_time.step_seconds``) and finds the bandwidth and compute
efficiencies, the knee sharpness and the fixed time per step that best match the measured steps (``fit``);
the result is a ``[gpus."GPU-measured"]`` table that loads beside the derived one. ``--refit`` fits recorded
runs instead of timing. ``--device cpu --tiny`` runs a two-layer stack on the CPU: it checks the script, its
numbers are no profile.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
import typing as t

import numpy as np

from tidal_engine.step_time import Profile
from tidal_engine.step_time import sequence_pairs
from tidal_engine.step_time import step_seconds
from tidal_workers.bench import twin
from tidal_workers.bench.twin import Cell

if t.TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True)
class StackShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    @classmethod
    def of(cls, profile: Profile, intermediate_size: int) -> StackShape:
        return cls(
            profile.hidden_size,
            intermediate_size,
            profile.num_layers,
            profile.num_heads,
            profile.num_kv_heads,
            profile.head_dim,
            profile.vocab_size,
        )


# A step of exactly 192 tokens ran slow wherever the H200 stack ran one beside decodes (128 + 64, 64 + 128):
# slower than the same step with more tokens (gpu-calibration-h200.md). A kernel-selection artefact of the stack.
ANOMALOUS_TOKENS = 192


# Knee sharpness s of the coarse search: s = 1 adds the two terms; at s = MAX_SHARPNESS the knee is as good as hard
# (2^(1/s) - 1 = 2 % at the knee itself).
MAX_SHARPNESS = 35.0
SHARPNESS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0, 20.0, MAX_SHARPNESS)


@dataclasses.dataclass(frozen=True)
class Step:
    """A measured step's shape: ``decodes`` requests of ``decode_context`` cached tokens, one token each, beside one
    prefill chunk of ``prefill`` tokens after ``prefill_context`` of its own cached (either part may be empty)."""

    decodes: int
    decode_context: int
    prefill: int
    prefill_context: int

    @classmethod
    def of(cls, cell: Cell) -> Step:
        if cell.kind == "decode":
            return cls(cell.tokens, cell.context, 0, 0)
        return cls(0, 0, cell.tokens, cell.context)

    @property
    def label(self) -> str:
        if not self.prefill:
            return Cell("decode", self.decodes, self.decode_context).label
        if not self.decodes:
            return Cell("prefill", self.prefill, self.prefill_context).label
        return f"mixed(n={self.decodes}, c={self.decode_context}, P={self.prefill}, C={self.prefill_context})"

    @property
    def shape(self) -> tuple[int, int, int]:
        """(P, C, attention pairs) of the step, as ``step_seconds`` takes them."""
        pairs = self.decodes * sequence_pairs(1, self.decode_context)
        if self.prefill:
            pairs += sequence_pairs(self.prefill, self.prefill_context)
        return self.decodes + self.prefill, self.decodes * self.decode_context + self.prefill_context, pairs

    @property
    def not_fitted(self) -> str:
        """Why the fit leaves this step out ("" when it does not): the stack's own artefacts, not the GPU's."""
        if self.prefill and self.prefill_context:
            return "prefill after cached context: the stack's masked attention, slower than vLLM's kernels"
        if self.decodes and self.prefill and self.decodes + self.prefill == ANOMALOUS_TOKENS:
            return f"a mixed step of {ANOMALOUS_TOKENS} tokens: a matrix-shape slowdown of the stack's kernels"
        return ""


# MLP widths (config.json's intermediate_size; the profiles need only parameter counts).
INTERMEDIATE = {"qwen2.5-7b": 18944, "llama-3.1-8b": 14336}
# The steps timed on a GPU: the twin's grid, then prefill chunks alone and beside decodes across the knee, which
# the twin's grid barely touches and the knee sharpness needs (docs/engine.md, "The knee").
GRID = (
    *(Step.of(cell) for cell in twin.GRID),
    *(Step(0, 0, p, 0) for p in (64, 128, 256, 1024)),
    *(Step(n, 1024, p, 0) for n in (16, 64) for p in (16, 64, 160, 256, 512)),
)
# The tiny CPU check: a two-layer stack over small steps of the same kinds.
TINY_GRID = (Step(1, 64, 0, 0), Step(8, 128, 0, 0), Step(0, 0, 128, 0), Step(0, 0, 128, 128), Step(4, 64, 32, 0))
TINY = StackShape(
    hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=1024
)


class Stack:
    """Random weights of a decoder stack on one device, and one step of it for a cell."""

    def __init__(self, shape: StackShape, device: torch.device, dtype: torch.dtype, seed: int = 0):
        import torch

        self.shape, self.device, self.dtype = shape, device, dtype
        gen = torch.Generator(device=device).manual_seed(seed)
        s = shape

        def weight(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=gen, device=device, dtype=dtype) * 0.02).contiguous()

        qkv = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
        self.layers = [
            (
                weight(s.hidden_size, qkv),
                weight(s.num_heads * s.head_dim, s.hidden_size),
                weight(s.hidden_size, 2 * s.intermediate_size),
                weight(s.intermediate_size, s.hidden_size),
            )
            for _ in range(s.num_layers)
        ]
        self.lm_head = weight(s.hidden_size, s.vocab_size)

    def step_fn(self, step: Step) -> t.Callable[[], torch.Tensor]:
        """A closure running one step of the given shape on inputs and KV caches allocated here.

        The linear layers run over all the step's tokens at once, attention per part (the decodes, the prefill
        chunk), as vLLM's chunked-prefill step runs them.
        """
        import torch
        import torch.nn.functional as F

        s, dev, dt = self.shape, self.device, self.dtype
        parts = []  # (sequences, query tokens each, cached tokens each)
        if step.decodes:
            parts.append((step.decodes, 1, step.decode_context))
        if step.prefill:
            parts.append((1, step.prefill, step.prefill_context))
        x = torch.randn(sum(seqs * query for seqs, query, _ in parts), s.hidden_size, device=dev, dtype=dt)
        caches = [
            [
                torch.randn(2, seqs, s.num_kv_heads, context + query, s.head_dim, device=dev, dtype=dt)
                for seqs, query, context in parts
            ]
            for _ in range(s.num_layers)
        ]
        masks = []
        for _, query, context in parts:  # causal after the cached context
            keys = context + query
            masks.append(
                torch.arange(keys, device=dev)[None, :] <= (context + torch.arange(query, device=dev))[:, None]
                if query > 1 and context > 0
                else None
            )
        # Each sequence's last token, whose logits the step samples from.
        last = torch.tensor(
            [*range(step.decodes), *([step.decodes + step.prefill - 1] if step.prefill else [])], device=dev
        )
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim

        def rms(h: torch.Tensor) -> torch.Tensor:
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)

        def attend(qkv: torch.Tensor, cache: torch.Tensor, part: tuple[int, int, int], mask: t.Any) -> torch.Tensor:
            seqs, query, context = part
            q = qkv[:, :q_size].view(seqs, query, s.num_heads, s.head_dim).transpose(1, 2)
            k_new = qkv[:, q_size : q_size + kv_size].view(seqs, query, s.num_kv_heads, s.head_dim)
            cache[0, :, :, context:].copy_(k_new.transpose(1, 2))
            cache[1, :, :, context:].copy_(
                qkv[:, q_size + kv_size :].view(seqs, query, s.num_kv_heads, s.head_dim).transpose(1, 2)
            )
            attn = F.scaled_dot_product_attention(
                q, cache[0], cache[1], attn_mask=mask, is_causal=mask is None and query > 1, enable_gqa=True
            )
            return attn.transpose(1, 2).reshape(seqs * query, q_size)

        def run() -> torch.Tensor:
            h = x
            for (w_qkv, w_o, w_gate_up, w_down), layer_caches in zip(self.layers, caches, strict=True):
                qkv, start, outs = rms(h) @ w_qkv, 0, []
                for part, cache, mask in zip(parts, layer_caches, masks, strict=True):
                    rows = part[0] * part[1]
                    outs.append(attend(qkv[start : start + rows], cache, part, mask))
                    start += rows
                h = h + torch.cat(outs) @ w_o
                gate, up = (rms(h) @ w_gate_up).chunk(2, dim=-1)
                h = h + (F.silu(gate) * up) @ w_down
            return rms(h)[last] @ self.lm_head

        return run


def time_step(run: t.Callable[[], t.Any], device: torch.device, reps: int) -> list[float]:
    """Seconds per step: CUDA-graph replays timed by CUDA events on a GPU, perf_counter on a CPU."""
    import torch

    if device.type != "cuda":
        run()  # warm-up
        samples = []
        for _ in range(reps):
            started = time.perf_counter()
            run()
            samples.append(time.perf_counter() - started)
        return samples
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000.0)
    return samples


CELL_LABEL = re.compile(r"(decode|prefill)\((?:n|P)=(\d+), (?:c|C)=(\d+)\)")
MIXED_LABEL = re.compile(r"mixed\(n=(\d+), c=(\d+), P=(\d+), C=(\d+)\)")


def recorded_steps(report: t.Mapping[str, t.Any]) -> list[tuple[Step, float]]:
    """The measured steps of a recorded run: a calibrate.json's ``table`` (cells by label) or a mixed-step run's
    ``rows`` (``n`` decodes at ``c`` cached each beside a chunk of ``P`` after ``C``)."""
    steps = []
    for row in report.get("table", ()):
        if cell := CELL_LABEL.fullmatch(row["cell"]):
            step = Step.of(Cell(cell[1], int(cell[2]), int(cell[3])))
        elif mixed := MIXED_LABEL.fullmatch(row["cell"]):
            step = Step(*(int(g) for g in mixed.groups()))
        else:
            raise ValueError(f"not a step label: {row['cell']!r}")
        steps.append((step, float(row["measured_s"])))
    steps.extend((Step(r["n"], r["c"], r["P"], r["C"]), float(r["measured_s"])) for r in report.get("rows", ()))
    return steps


def fit(profile: Profile, measured: t.Sequence[tuple[Step, float]]) -> dict[str, float]:
    """Bandwidth and compute efficiency, knee sharpness and fixed step time that best fit the measured steps.

    Least squares on relative error over the steps that are not ``not_fitted``: the fixed time in closed form
    for each candidate (0.1 ms resolution), the rest over a coarse grid and then a fine one around its best
    (efficiencies to 0.01, sharpness to 0.05 between 1 and ``MAX_SHARPNESS``; the largest stands for a hard knee).
    """
    steps = [s for s, _ in measured if not s.not_fitted]
    seconds = np.array([m for s, m in measured if not s.not_fitted])

    def evaluate(bw: float, fl: float, sharpness: float) -> tuple[float, dict[str, float]]:
        candidate = dataclasses.replace(
            profile,
            bandwidth_efficiency=bw,
            compute_efficiency=fl,
            knee_sharpness=sharpness,
            step_overhead_s=0.0,
        )
        base = np.array([step_seconds(candidate, *s.shape) for s in steps])
        # (base + overhead) / seconds - 1 is linear in the overhead: its least-squares value, kept >= 0.
        overhead = max(0.0, float(np.sum((1.0 - base / seconds) / seconds) / np.sum(seconds**-2.0)))
        overhead = round(overhead, 4)
        loss = float(np.mean(np.square((base + overhead) / seconds - 1.0)))
        values = {
            "bandwidth_efficiency": float(bw),
            "compute_efficiency": float(fl),
            "knee_sharpness": float(sharpness),
            "step_overhead_s": overhead,
        }
        return loss, values

    def search(bws: t.Iterable[float], fls: t.Iterable[float], sharps: t.Iterable[float]) -> dict[str, float]:
        grid = itertools.product(bws, fls, sharps)
        loss, values = min((evaluate(*point) for point in grid), key=lambda lv: lv[0])
        return {**values, "rms_relative_error": float(np.sqrt(loss))}

    def around(value: float, step: float, count: int, low: float, high: float) -> list[float]:
        return sorted({round(min(high, max(low, value + i * step)), 2) for i in range(-count, count + 1)})

    coarse = search(np.round(np.arange(0.1, 1.0001, 0.05), 2), np.round(np.arange(0.1, 1.0001, 0.05), 2), SHARPNESS)
    return search(
        around(coarse["bandwidth_efficiency"], 0.01, 6, 0.01, 1.0),
        around(coarse["compute_efficiency"], 0.01, 6, 0.01, 1.0),
        around(coarse["knee_sharpness"], 0.05, 10, 1.0, MAX_SHARPNESS),
    )


def run(
    profile: Profile,
    shape: StackShape,
    grid: t.Sequence[Step],
    device_name: str,
    reps: int,
    budget_s: float,
) -> dict[str, t.Any]:
    """Time every cell (within ``budget_s``), then fit; returns samples, fit and the measured GPU table."""
    import torch

    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.monotonic()
    stack = Stack(shape, device, dtype)
    samples: dict[str, list[float]] = {}
    skipped = []
    for cell in grid:
        if time.monotonic() - started > budget_s:
            skipped.append(cell.label)
            continue
        samples[cell.label] = time_step(stack.step_fn(cell), device, reps)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    medians = {c: float(np.median(samples[c.label])) for c in grid if c.label in samples}
    fitted = fit(profile, list(medians.items())) if medians else {}
    return {
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": str(dtype),
        "shape": dataclasses.asdict(shape),
        "seconds": round(time.monotonic() - started, 1),
        "samples_s": samples,
        "skipped": skipped,
        "table": [
            {
                "cell": c.label,
                "measured_s": medians[c],
                "derived_s": step_seconds(profile, *c.shape),
            }
            for c in medians
        ],
        "fit": fitted,
    }


def refit(profile: Profile, steps: t.Sequence[tuple[Step, float]]) -> dict[str, t.Any]:
    """The fit of recorded steps, and each step measured against the fitted form, with why the fit leaves it out."""
    fitted = fit(profile, steps)
    measured = dataclasses.replace(
        profile,
        bandwidth_efficiency=fitted["bandwidth_efficiency"],
        compute_efficiency=fitted["compute_efficiency"],
        knee_sharpness=fitted["knee_sharpness"],
        step_overhead_s=fitted["step_overhead_s"],
    )
    table = [
        {
            **dataclasses.asdict(step),
            "measured_s": seconds,
            "fitted_s": step_seconds(measured, *step.shape),
            "error": step_seconds(measured, *step.shape) / seconds - 1.0,
            "not_fitted": step.not_fitted,
        }
        for step, seconds in steps
    ]
    return {"table": table, "fit": fitted}


def measured_toml(gpu: str, gpu_table: t.Mapping[str, t.Any], fitted: t.Mapping[str, float]) -> str:
    """A ``[gpus."GPU-measured"]`` table: the datasheet rates with the fitted efficiencies and step time."""
    values = {**gpu_table, **{k: v for k, v in fitted.items() if k in gpu_table}}
    lines = [
        f"# Written by `tidal bench calibrate` (rms relative error of the fit {fitted['rms_relative_error']:.3f}).",
        f'[gpus."{gpu}-measured"]',
    ]
    lines += [f"{k} = {v!r}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
