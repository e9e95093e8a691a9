"""Reclaiming expired leases, with a cap per item: a line whose run kills its worker is not rerun for ever.

A lease expires when its worker stopped renewing it: the process died (killed, out of memory) or lost Redis for
longer than a lease. Every live node's renewal thread and beat's reclaim sweep take expired leases off
(``Queue.take_expired``), then count one reclaim against each item still pending, in SQL (``items.reclaims``, so the
count survives restarts and holds across nodes), before it goes back to the queue (``Queue.requeue``). At
``TIDAL_RECLAIM_LIMIT`` the item is written as failed with the error code ``worker_lost`` instead, and
``tidal_worker_lost_items_total`` counts it, which the ``TidalWorkerLostItem`` alert watches: one line whose
answer (or request) takes its worker down would otherwise be run again, and take the next worker down, until its
batch's window ends, each run's GPU work unbilled.

Only an expired lease counts. A worker that is alive gives its claims back itself (``handback.py``: an engine
outage, a failed preflight, a claim whose task never started, a stopping worker) through ``Queue.give_back``,
which counts nothing; a request the engine holds (parked, queued) keeps its lease, which the renewal thread
extends. Items that were in flight beside the one that killed their worker are counted too: each needs as many
deaths to be written off, and they are spread over other nodes when they are claimed again.
"""

from __future__ import annotations

import dataclasses
import enum
import logging

import prometheus_client
from sqlalchemy import bindparam
from sqlalchemy import update

from tidal_workers.finalize import request_finalize
from tidal_workers.queue import Expired
from tidal_workers.result import Entry
from tidal_workers.result import Outcome
from tidal_workers.result import write_outcomes
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

WORKER_LOST = "worker_lost"

LOST_ITEMS = prometheus_client.Counter(
    "tidal_worker_lost_items",
    "Items written as failed (worker_lost) because their lease expired TIDAL_RECLAIM_LIMIT times: each time the "
    "worker running them died. Counted by the process that reclaimed them the last time.",
)

log = logging.getLogger(__name__)


class Fate(enum.Enum):
    requeued = "requeued"  # back in its batch, for any node
    lost = "lost"  # written as failed (worker_lost): its reclaims reached the limit
    settled = "settled"  # its result was written already (the worker died after its commit): forgotten
    abandoned = "abandoned"  # its batch was dropped (cancelled, expired, finalized)


@dataclasses.dataclass(frozen=True)
class Reclaimed:
    item_id: int
    batch_id: str
    fate: Fate


_COUNT_RECLAIMS = (
    update(Item)
    .where(Item.id.in_(bindparam("item_ids", expanding=True)), Item.status == ItemStatus.pending.value)
    .values(reclaims=Item.reclaims + 1)
    .returning(Item.id, Item.reclaims)
)


def count_reclaims(rt: Runtime, item_ids: list[int]) -> dict[int, int]:
    """Count one reclaim against each pending item of ``item_ids``; returns their reclaims so far (settled items
    are left out)."""
    if not item_ids:
        return {}
    with rt.store.transaction() as s:
        return {row.id: row.reclaims for row in s.execute(_COUNT_RECLAIMS, {"item_ids": item_ids})}


def lost(e: Expired, reclaims: int) -> Entry:
    """The error line of an item whose worker died ``reclaims`` times, under the attempt that died last."""
    message = (
        f"The worker running this request stopped without answering (killed, or out of memory) {reclaims} times; "
        "it is not run again."
    )
    return Entry(e.attempt, e.batch_id, Outcome(ItemStatus.failed, error_code=WORKER_LOST, error_message=message))


def reclaim(rt: Runtime, limit: int = 1000) -> list[Reclaimed]:
    """Reclaim up to ``limit`` expired leases: each item goes back to the queue, or is written as lost at the
    reclaim limit. The batches whose work is over then (or whose abandoned items were the last in flight) are sent
    to the ops worker to finalize: a GPU node's renewal thread runs this too, and never writes a batch's files."""
    expired = rt.queue.take_expired(limit)
    taken = [e for e in expired if e.taken]
    try:
        counts = count_reclaims(rt, [e.item_id for e in taken])
        at_limit = [e for e in taken if counts.get(e.item_id, 0) >= rt.settings.reclaim_limit]
        written, due = write_outcomes(rt, [lost(e, counts[e.item_id]) for e in at_limit]) if at_limit else ([], [])
    except BaseException:  # SQL failed: every item goes back (uncounted if the count did not commit), as before
        rt.queue.requeue([(e.item_id, True) for e in taken])
        raise
    gone = {e.item_id for e in at_limit}
    rt.queue.requeue([(e.item_id, e.item_id in counts and e.item_id not in gone) for e in taken])
    for e, first in zip(at_limit, written):
        if first:
            LOST_ITEMS.inc()
            log.warning(
                "item %d of batch %s: its lease expired %d times (its worker died each time): written as %s",
                e.item_id,
                e.batch_id,
                counts[e.item_id],
                WORKER_LOST,
            )
    for batch_id in sorted(set(due) | {e.batch_id for e in expired if not e.taken and e.batch_id}):
        request_finalize(rt, batch_id)
    return [Reclaimed(e.item_id, e.batch_id, _fate(e, counts, gone)) for e in expired]


def _fate(e: Expired, counts: dict[int, int], gone: set[int]) -> Fate:
    if not e.taken:
        return Fate.abandoned
    if e.item_id in gone:
        return Fate.lost
    return Fate.requeued if e.item_id in counts else Fate.settled
