"""The models a node claims: those its engine serves, read from the engine's ``/v1/models`` and published to Redis.

vLLM lists every name it serves there: each ``--served-model-name`` (several are allowed) and each loaded LoRA
adapter. The renewal thread re-reads the list every third of a lease (the claim loop only reads it first, before
its first pass) and records it in ``tidal:node:{node}:models`` for a lease's time, so the API can tell a batch whose model no live node serves (it waits, queued, and its
``tidal`` extension says so). An engine that does not answer serves nothing: the node claims nothing until it
answers again, rather than turn items into error lines.
"""

from __future__ import annotations

import logging

import requests

from tidal_workers.health import ENGINE_TIMEOUT_SECONDS
from tidal_workers.runtime import Runtime

log = logging.getLogger(__name__)


def engine_models(vllm_url: str, timeout: float = ENGINE_TIMEOUT_SECONDS) -> tuple[str, ...]:
    """The model names the engine at ``vllm_url`` serves (base models and adapters), sorted."""
    answer = requests.get(vllm_url.rstrip("/") + "/v1/models", timeout=timeout)
    answer.raise_for_status()
    return tuple(sorted({str(entry["id"]) for entry in answer.json()["data"]}))


class ServedModels:
    """This node's served models: re-read by the renewal thread every third of a lease, used by the claim loop."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.models: tuple[str, ...] = ()
        self._read = False

    def current(self) -> tuple[str, ...]:
        """The last list read, without I/O once one was read (the renewal thread keeps it fresh)."""
        return self.models if self._read else self.refresh()

    def refresh(self) -> tuple[str, ...]:
        """Re-read the engine's list and publish it for a lease."""
        s = self.rt.settings
        self._read = True
        try:
            models = engine_models(s.vllm_url)
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            if self.models:
                log.warning("engine %s lists no models (%s): claiming nothing", s.vllm_url, type(exc).__name__)
            models = ()
        if models and models != self.models:
            log.info("engine %s serves %s: claiming their batches", s.vllm_url, ", ".join(models))
        self.models = models
        self.rt.queue.publish_models(s.node, models, ttl=s.lease_seconds)
        return models


__all__ = ["ServedModels", "engine_models"]
