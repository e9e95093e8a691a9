"""Which metric series the gate reads for each of its four signals, and from which /metrics pages.

The AIMD rule (:mod:`tidal_workers.policy.aimd`) sees only an :class:`Observation`: KV use, online waiting,
running, preemptions. What those are called depends on the deployment, so the gate reads them through a
:class:`SignalMap` and the policy code never changes:

- ``vllm`` (default): one co-located vLLM, its own names, on the page at ``TIDAL_VLLM_URL``.
- ``disagg``: a prefill pool and a decode pool of stock vLLM engines (plus a router that may front them).
  KV use is the fuller pool's (the prefill pool computes the KV, the decode pool must hold it); waiting,
  running and preemptions are summed over both pools. Batch work is admitted while the prefill pool idles.
- ``dynamo``: NVIDIA Dynamo's published names (docs.nvidia.com/dynamo, "Dynamo Metrics"): KV use from the
  workers' ``dynamo_component_kvstats_gpu_cache_usage_percent`` (the KV block manager's gauge, 0-1), waiting
  from the frontend's queue depth ``dynamo_frontend_queued_requests``, running from its
  ``dynamo_frontend_inflight_requests``; Dynamo publishes no preemption counter of its own, so preemptions
  are the workers' pass-through ``vllm:num_preemptions_total``.

A page is named by its *source*: ``engine`` is always ``TIDAL_VLLM_URL``; ``prefill``, ``decode`` and
``router`` come from ``TIDAL_GATE_METRICS_URLS`` (parsed and checked by Settings).
"""

from __future__ import annotations

import dataclasses
import typing as t

ENGINE = "engine"
PREFILL = "prefill"
DECODE = "decode"
ROUTER = "router"
SOURCES = (ENGINE, PREFILL, DECODE, ROUTER)

VLLM_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the current name first, then the pre-V1 one
VLLM_WAITING = ("vllm:num_requests_waiting",)
VLLM_RUNNING = ("vllm:num_requests_running",)
VLLM_PREEMPTIONS = ("vllm:num_preemptions_total",)
DYNAMO_KV = ("dynamo_component_kvstats_gpu_cache_usage_percent",)
DYNAMO_QUEUED = ("dynamo_frontend_queued_requests",)
DYNAMO_INFLIGHT = ("dynamo_frontend_inflight_requests",)

Reduce = t.Literal["max", "sum"]


@dataclasses.dataclass(frozen=True)
class Signal:
    """One signal: the first of ``names`` found on each of ``sources``' pages, summed over label sets there,
    then combined across pages by ``reduce``. A page lacking every one of ``names`` fails the reading."""

    names: tuple[str, ...]
    sources: tuple[str, ...] = (ENGINE,)
    reduce: Reduce = "sum"


@dataclasses.dataclass(frozen=True)
class SignalMap:
    name: str
    kv_usage: Signal
    waiting: Signal
    running: Signal
    preemptions: Signal

    def signals(self) -> dict[str, Signal]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}

    def sources(self) -> tuple[str, ...]:
        """The pages this map reads, in SOURCES order."""
        used = {src for sig in self.signals().values() for src in sig.sources}
        return tuple(s for s in SOURCES if s in used)


VLLM = SignalMap(
    "vllm",
    kv_usage=Signal(VLLM_KV, reduce="max"),
    waiting=Signal(VLLM_WAITING),
    running=Signal(VLLM_RUNNING),
    preemptions=Signal(VLLM_PREEMPTIONS),
)
_POOLS = (PREFILL, DECODE)
DISAGG = SignalMap(
    "disagg",
    kv_usage=Signal(VLLM_KV, _POOLS, "max"),
    waiting=Signal(VLLM_WAITING, _POOLS),
    running=Signal(VLLM_RUNNING, _POOLS),
    preemptions=Signal(VLLM_PREEMPTIONS, _POOLS),
)
DYNAMO = SignalMap(
    "dynamo",
    kv_usage=Signal(DYNAMO_KV + VLLM_KV, _POOLS, "max"),
    waiting=Signal(DYNAMO_QUEUED, (ROUTER,)),
    running=Signal(DYNAMO_INFLIGHT, (ROUTER,)),
    preemptions=Signal(VLLM_PREEMPTIONS, _POOLS),
)
MAPS = {m.name: m for m in (VLLM, DISAGG, DYNAMO)}


def combine(signal: Signal, pages: t.Mapping[str, t.Mapping[str, list[float]]]) -> tuple[float | None, list[str]]:
    """The signal's value from each source page's samples ({name: values}), or None and what was missing."""
    per_source: list[float] = []
    missing: list[str] = []
    for source in signal.sources:
        page = pages.get(source, {})
        found = next((page[n] for n in signal.names if page.get(n)), None)
        if found is None:
            missing.append(f"{signal.names[0]} on {source}")
            continue
        per_source.append(max(found) if signal.reduce == "max" else sum(found))
    if missing:
        return None, missing
    return (max(per_source) if signal.reduce == "max" else sum(per_source)), []
