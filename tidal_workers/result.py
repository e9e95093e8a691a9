"""Record one item's outcome in SQL exactly once, then release its lease (finalizing is the caller's to ask for).

Delivery is at least once (a dead worker's item runs again), so the write is
idempotent: ``UPDATE items ... WHERE status = 'pending'`` lets the first write
win, and a result under a lease that is no longer current is dropped before it
gets there. request_counts and billed usage move in the same transaction.
"""

from __future__ import annotations

import dataclasses
import time

import prometheus_client
from sqlalchemy import select
from sqlalchemy import update

from tidal_workers.policy.pricing import Usage
from tidal_workers.queue import parse_lease
from tidal_workers.runtime import Runtime
from tidal_workers.store.db import rows_updated
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

HARVESTED = prometheus_client.Counter(
    "tidal_node_batch_tokens",
    "Billed tokens of batch items this worker completed (the node's harvest), by kind (input, output).",
    ["kind"],
)
for _kind in ("input", "output"):
    HARVESTED.labels(_kind)  # export both series from the start, at 0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the engine made of one item: a response line, or an error line."""

    status: ItemStatus  # completed or failed
    response_status: int | None = None  # the engine's HTTP status, when it answered
    request_id: str | None = None
    body: str | None = None  # the engine's response body (JSON text)
    error_code: str | None = None  # set when there is no engine response to show
    error_message: str | None = None
    usage: Usage = Usage()


def record(rt: Runtime, item_id: int, batch_id: str, lease: str, outcome: Outcome) -> bool:
    """Write ``outcome`` if ``lease`` is current and the item still pending; True if this call wrote it."""
    if not rt.queue.lease_current(item_id, lease):
        return False
    now = int(time.time())
    completed = outcome.status is ItemStatus.completed
    usage = outcome.usage
    with rt.store.transaction() as s:
        # Lock the batch row first, as finalize does, so the two never deadlock on PostgreSQL.
        s.execute(select(Batch.id).where(Batch.id == batch_id).with_for_update())
        written = (
            rows_updated(
                s,
                update(Item)
                .where(Item.id == item_id, Item.status == ItemStatus.pending.value)
                .values(
                    status=outcome.status.value,
                    attempts=parse_lease(lease)[1],
                    response_status=outcome.response_status,
                    request_id=outcome.request_id,
                    response_body=outcome.body,
                    error_code=outcome.error_code,
                    error_message=outcome.error_message,
                    finished_at=now,
                    input_tokens=usage.input_tokens,
                    cached_tokens=usage.cached_tokens,
                    output_tokens=usage.output_tokens,
                    reasoning_tokens=usage.reasoning_tokens,
                ),
            )
            == 1
        )
        if written and completed:  # only completed items are billed
            s.execute(
                update(Batch)
                .where(Batch.id == batch_id)
                .values(
                    completed=Batch.completed + 1,
                    input_tokens=Batch.input_tokens + usage.input_tokens,
                    cached_tokens=Batch.cached_tokens + usage.cached_tokens,
                    output_tokens=Batch.output_tokens + usage.output_tokens,
                    reasoning_tokens=Batch.reasoning_tokens + usage.reasoning_tokens,
                )
            )
        elif written:
            s.execute(update(Batch).where(Batch.id == batch_id).values(failed=Batch.failed + 1))
    if written and completed:
        HARVESTED.labels("input").inc(usage.input_tokens)
        HARVESTED.labels("output").inc(usage.output_tokens)
    rt.queue.complete(item_id, lease)
    return written
