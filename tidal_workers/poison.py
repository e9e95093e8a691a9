"""Poison items: a request that kills the engine becomes an error line after a few deaths, not an endless outage.

An engine outage costs an item no retry (``engine_health``), so a line whose request crashes vLLM would be handed
back and replayed against every node's engine, which also serves online traffic, for the batch's whole window.
So each engine death is counted against every item whose request was at the engine when it died (its request
broken or timed out while ``/health`` fails; a refused connection means the engine was already gone, and counts
nothing). The count lives in SQL (``items.engine_deaths``), so it survives worker restarts and holds across nodes;
at ``TIDAL_ENGINE_CRASH_LIMIT`` the item is written as failed with the error code ``engine_crash`` and
``tidal_engine_crash_items_total`` counts it, which the ``TidalEngineCrashItem`` alert watches. An item that was
merely at the engine beside the poison one may be counted too; it needs as many deaths to be written off.
"""

from __future__ import annotations

import prometheus_client
from sqlalchemy import bindparam
from sqlalchemy import update

from tidal_workers.result import Outcome
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

ENGINE_CRASH = "engine_crash"

CRASH_ITEMS = prometheus_client.Counter(
    "tidal_engine_crash_items",
    "Items written as failed (engine_crash) because the engine died while they were at it TIDAL_ENGINE_CRASH_LIMIT times.",
)

_COUNT_DEATH = (
    update(Item)
    .where(Item.id == bindparam("item_id"), Item.status == ItemStatus.pending.value)
    .values(engine_deaths=Item.engine_deaths + 1)
    .returning(Item.engine_deaths)
)


def count_death(rt: Runtime, item_id: int) -> int:
    """Count one engine death against a pending item; returns its deaths so far (0 if it is settled)."""
    with rt.store.driver_transaction() as cursor:
        row = rt.store.driver(_COUNT_DEATH).one_or_none(cursor, {"item_id": item_id})
    return row[0] if row is not None else 0


def quarantine(rt: Runtime, item_id: int, why: str) -> Outcome | None:
    """After an engine death with ``item_id`` at the engine: its error line once it has been at the engine for
    ``TIDAL_ENGINE_CRASH_LIMIT`` deaths, else None (hand it back, as any outage)."""
    deaths = count_death(rt, item_id)
    if deaths < rt.settings.engine_crash_limit:
        return None
    CRASH_ITEMS.inc()
    return Outcome(
        status=ItemStatus.failed,
        error_code=ENGINE_CRASH,
        error_message=f"The engine died {deaths} times while this request was at it; last: {why}"[:1000],
    )
