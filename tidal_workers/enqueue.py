"""Enqueue: put pending items of open batches into the Redis queue, from SQL (the source of truth).

``enqueue_batch`` runs once a batch validates; ``rebuild`` runs at worker start,
when a worker sees Redis lost its data, and in the reconcile sweep. Both are
idempotent: pushing an item that is already queued changes nothing, and an item
holding a lease is in flight and is left alone.
"""

from __future__ import annotations

import time
import typing as t

from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

ROWS = 5000


def _pending(session: Session, batch_id: str) -> t.Iterator[tuple[int, int, str]]:
    """(item id, ordinal, phase) of the batch's pending items: each is queued as the phase SQL says is next."""
    rows = session.execute(
        select(Item.id, Item.ordinal, Item.phase)
        .where(Item.batch_id == batch_id, Item.status == ItemStatus.pending.value)
        .order_by(Item.ordinal)
        .execution_options(yield_per=ROWS)
    )
    return ((item_id, ordinal, phase) for item_id, ordinal, phase in rows)


def enqueue_batch(rt: Runtime, batch_id: str) -> int:
    """Push every pending item of ``batch_id`` if it is in progress; returns how many were queued.

    The batch is queued under its model and tenant, with the tenant's claim weight from ``Settings.limits_for``.
    """
    with rt.store.read() as s:
        batch = s.execute(
            select(Batch.status, Batch.priority, Batch.expires_at, Batch.model, Batch.tenant_id).where(
                Batch.id == batch_id
            )
        ).one_or_none()
        if batch is None or batch.status != BatchStatus.in_progress.value:
            return 0
        return rt.queue.enqueue_batch(
            batch_id,
            batch.priority,
            batch.expires_at,
            _pending(s, batch_id),
            model=batch.model or "",  # a batch without a model has no valid line, so nothing to queue
            tenant=batch.tenant_id,
            weight=rt.settings.limits_for(batch.tenant_id).weight,
        )


def rebuild(rt: Runtime) -> int:
    """Rebuild the whole queue from SQL: every pending item of every in-progress batch not leased.

    Batches Redis still queues but SQL no longer has in progress (a cancel that
    raced a rebuild) are dropped. Also the upgrade step of the key layout: a batch
    queued by an older layout is moved into this one (``keys.LAYOUT``). Returns the
    number of items queued.
    """
    started = time.time()
    with rt.store.read() as s:
        open_ids = set(s.scalars(select(Batch.id).where(Batch.status == BatchStatus.in_progress.value)))
    not_open = set(rt.queue.queued_batches()) - open_ids
    if not_open:  # read again: a batch whose ingest committed and queued it since the first read is open, not stale
        with rt.store.read() as s:
            still_open = set(
                s.scalars(select(Batch.id).where(Batch.id.in_(not_open), Batch.status == BatchStatus.in_progress.value))
            )
        for stale in not_open - still_open:
            rt.queue.drop_batch(stale)
    queued = sum(enqueue_batch(rt, batch_id) for batch_id in sorted(open_ids))
    rt.queue.mark_built(started)
    return queued


__all__ = ["enqueue_batch", "rebuild"]
