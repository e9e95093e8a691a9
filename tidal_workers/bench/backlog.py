"""Batch work kept in flight straight to vLLM (no Tidal): the harvest's ceiling, and the frontier's vLLM-alone peer
(the batch at the lowest priority, at a fixed concurrency)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import typing as t

import httpx


class Counts:
    """What the lanes did so far: requests at the engine now, requests completed (read from another thread)."""

    def __init__(self) -> None:
        self.inflight = 0
        self.done = 0


async def closed_loop(
    engine_url: str, bodies: t.Iterator[dict], lanes: int, deadline: float, counts: Counts | None = None
) -> int:
    """``lanes`` requests always in flight until ``deadline`` (time.monotonic()); returns how many completed.
    Cancelling the task closes the connections, and vLLM aborts what they carried."""
    counts = counts or Counts()
    limits = httpx.Limits(max_connections=lanes + 8, max_keepalive_connections=lanes + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def lane() -> None:
            while time.monotonic() < deadline:
                counts.inflight += 1
                try:
                    resp = await client.post(f"{engine_url}/v1/chat/completions", json=next(bodies))
                finally:
                    counts.inflight -= 1
                resp.raise_for_status()
                counts.done += 1

        await asyncio.gather(*(lane() for _ in range(lanes)))
    return counts.done


class Lanes:
    """``closed_loop`` in a thread of its own for as long as the context lasts; ``counts`` as it goes. Leaving
    the context cancels it (vLLM aborts the requests in flight); a lane's error is raised there."""

    def __init__(self, engine_url: str, bodies: t.Iterator[dict], lanes: int):
        self.counts = Counts()
        self._args = (engine_url, bodies, lanes)
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._task = self._loop.create_task(closed_loop(*self._args, deadline=float("inf"), counts=self.counts))
        self._started.set()
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # raised in the caller's thread on exit
            self._error = exc
        finally:
            self._loop.close()

    def __enter__(self) -> Lanes:
        self._thread.start()
        self._started.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None and not self._task.done():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the lanes had ended
                self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(60)
        if self._error is not None and not any(exc):
            raise self._error

    @property
    def failed(self) -> BaseException | None:
        return self._error
