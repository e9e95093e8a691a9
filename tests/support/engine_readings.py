"""Waiting on a real engine's state, as its /metrics page shows it (the benchmarks' reader, engine_stats.read)."""

from __future__ import annotations

import typing as t

from tests.support.wait import wait_for
from tidal_workers.bench import engine_stats


def reading_when(
    engine_url: str, ok: t.Callable[[engine_stats.Reading], bool], timeout: float, what: str
) -> engine_stats.Reading:
    """The engine's first reading for which ``ok`` holds, read every 20 ms; past ``timeout`` the failure names
    ``what`` and the last reading."""
    last: list[engine_stats.Reading] = []

    def seen() -> engine_stats.Reading | None:
        last[:] = [engine_stats.read(engine_url)]
        return last[0] if ok(last[0]) else None

    def state() -> str:
        r = last[0]
        return (
            f"{what} in {engine_url}/metrics (last: {r.running:g} running, {r.waiting:g} waiting, KV {r.kv_usage:.2f})"
        )

    return wait_for(seen, timeout, state, every=0.02)
