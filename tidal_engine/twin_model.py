"""The twin's model class: the tiny Qwen2 forward, then a sleep to the rest of the profile's T(P, C).

Loaded by vLLM inside its engine-core process (registered by ``twin.register``). vLLM's CPU platform
forces synchronous scheduling, so the engine core waits for ``forward()`` as a sync engine waits for its
GPU: sleeping here makes the whole step take the GPU's time while the process stays idle. The step's
P and C come from vLLM's forward context (the attention metadata's query and sequence lengths).

Settings travel in the model's config (``--hf-overrides``, set by ``serve.twin_options``):
``tidal_twin_profile`` names the profile, ``tidal_twin_trace`` a CSV file that gets one line per step
(``TRACE_COLUMNS``, times from the system-wide monotonic clock; ``tidal bench twin`` reads it). Every
``LOG_EVERY_S`` the process logs its step and overrun counts.
"""

from __future__ import annotations

import time
import typing as t

import torch
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.forward_context import is_forward_context_available
from vllm.logger import init_logger
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

from tidal_engine.step_time import Pacer
from tidal_engine.step_time import sequence_pairs
from tidal_engine.step_time import step_seconds
from tidal_engine.twin import DEFAULT_PROFILE
from tidal_engine.twin import load_profile

log = init_logger("vllm.tidal.twin")  # under vLLM's logger, whose handler the engine core configures

TRACE_COLUMNS = (
    "started_s",
    "num_tokens",
    "context",
    "pairs",
    "num_reqs",
    "target_s",
    "forward_s",
    "outside_s",
    "sleep_s",
    "overruns",
)
LOG_EVERY_S = 10.0


def step_shape() -> tuple[int, int, int, int] | None:
    """(P, C, attention pairs, requests) of the step being run; None for vLLM's dummy and profiling runs."""
    if not is_forward_context_available():
        return None
    metadata: t.Any = get_forward_context().attn_metadata
    if isinstance(metadata, list):
        metadata = metadata[0] if metadata else None
    if not metadata:
        return None
    first = next(iter(metadata.values()))
    starts = first.query_start_loc.tolist()
    seq_lens = first.seq_lens.tolist()
    num_reqs = len(starts) - 1
    context = pairs = 0
    for i in range(num_reqs):
        query = starts[i + 1] - starts[i]
        cached = seq_lens[i] - query
        context += cached
        pairs += sequence_pairs(query, cached)
    return int(first.num_actual_tokens), context, pairs, num_reqs


class TidalTwinForCausalLM(Qwen2ForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        hf_config = vllm_config.model_config.hf_config
        self.profile = load_profile(getattr(hf_config, "tidal_twin_profile", DEFAULT_PROFILE))
        self.pacer = Pacer()
        trace = getattr(hf_config, "tidal_twin_trace", "")
        # Line-buffered: vLLM kills the worker at shutdown, and a step's line must be readable once it ran.
        self._trace = open(trace, "a", buffering=1) if trace else None
        if self._trace is not None and self._trace.tell() == 0:
            self._trace.write(",".join(TRACE_COLUMNS) + "\n")
        self._last_end: float | None = None
        self._last_log = time.monotonic()
        log.info("timed twin: profile %s, KV pool %d tokens on the GPU", self.profile.name, self.profile.kv_pool_tokens)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: t.Any = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> t.Any:
        started = time.monotonic()
        hidden = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        shape = step_shape()
        if shape is not None:
            self._pace(started, *shape)
        return hidden

    def _pace(self, started: float, num_tokens: int, context: int, pairs: int, num_reqs: int) -> None:
        if self._last_end is not None:
            self.pacer.observe_gap(started - self._last_end)
        target = step_seconds(self.profile, num_tokens, context, pairs)
        forward_s = time.monotonic() - started
        outside = self.pacer.outside_s
        sleep = self.pacer.sleep_seconds(target, forward_s)
        if sleep > 0:
            time.sleep(sleep)
        now = self._last_end = time.monotonic()
        if self._trace is not None:
            row = (
                started,
                num_tokens,
                context,
                pairs,
                num_reqs,
                target,
                forward_s,
                outside,
                sleep,
                self.pacer.overruns,
            )
            self._trace.write(",".join(map(str, row)) + "\n")
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.info(
                "timed twin %s: %d steps, %d overruns (steps the engine could not slow down to T(P, C))",
                self.profile.name,
                self.pacer.steps,
                self.pacer.overruns,
            )
