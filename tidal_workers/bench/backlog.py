"""Batch work kept in flight straight to vLLM (no Tidal): the harvest's ceiling."""

from __future__ import annotations

import asyncio
import time
import typing as t

import httpx


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
