"""Batch work kept in flight straight to vLLM (no Tidal): the harvest's ceiling, and the fixed-prompt backlog of
the CPU-engine checks (the plugin's TBT test)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import typing as t

import httpx

from tidal_workers.bench import online
from tidal_workers.bench.workload import Request
from tidal_workers.bench.workload import chat_body


async def closed_loop(engine_url: str, bodies: t.Iterator[dict], lanes: int, deadline: float) -> int:
    """``lanes`` requests always in flight until ``deadline`` (time.monotonic()); returns how many completed.
    Cancelling the task closes the connections, and vLLM aborts what they carried."""
    done = 0
    limits = httpx.Limits(max_connections=lanes + 8, max_keepalive_connections=lanes + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def lane() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                resp = await client.post(f"{engine_url}/v1/chat/completions", json=next(bodies))
                resp.raise_for_status()
                done += 1

        await asyncio.gather(*(lane() for _ in range(lanes)))
    return done


class BatchShape(t.Protocol):
    """What a fixed-prompt batch request is made of (BacklogConfig says)."""

    model: str
    batch_prompt: str
    batch_max_tokens: int


def batch_body(cfg: BatchShape, n: int, priority: int | None = None) -> dict:
    """The n-th batch request. Its number comes first, so no two share a prefix: otherwise vLLM's prefix
    cache would serve every prefill after the first and the batch would cost only its decodes."""
    return chat_body(cfg.model, Request(0.0, f"[{n}] {cfg.batch_prompt}", cfg.batch_max_tokens), priority)


@dataclasses.dataclass
class BacklogConfig:
    engine_url: str
    model: str
    duration: float
    online_rate: float
    online_prompt: str
    online_max_tokens: int
    batch_prompt: str
    batch_max_tokens: int


def online_beside_backlog(cfg: BacklogConfig, lanes: int) -> list[online.OnlineSample]:
    """Flat online load while ``lanes`` batch requests are kept in flight straight to vLLM (no Tidal):
    the engine-level comparison of a scheduler with and without the plugin under the same backlog."""
    times = online.arrivals(online.flat(cfg.online_rate), cfg.duration)
    bodies = (batch_body(cfg, n, 100) for n in itertools.count())

    async def both() -> list[online.OnlineSample]:
        deadline = time.monotonic() + cfg.duration + 1.0
        backlog = asyncio.create_task(closed_loop(cfg.engine_url, bodies, lanes, deadline))
        await asyncio.sleep(1.0)  # the backlog is in the engine before the first online request
        samples = await online.run_online(cfg.engine_url, cfg.model, times, cfg.online_prompt, cfg.online_max_tokens)
        await backlog
        return samples

    return asyncio.run(both())
