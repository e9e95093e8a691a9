"""Cancel: stop a batch's claims at once, then ask for its finalize as cancelled.

Queued items are dropped from Redis immediately; items already in flight finish
(their results are kept) or are abandoned (a lease that expires is not
requeued). The ops worker then closes the batch as cancelled once nothing is in
flight (``finalize.perform_finalize``): at once on the request sent here if
nothing was, otherwise on the one its last in-flight item sends as it settles,
or on the reconcile sweep's pass. The caller (the HTTP cancel) never writes the
batch's files itself: for a large batch that is the slowest write there is.
"""

from __future__ import annotations

import time

from sqlalchemy import update

from tidal_workers.finalize import request_finalize
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus

CANCELLABLE = (BatchStatus.validating.value, BatchStatus.in_progress.value)


def cancel_batch(rt: Runtime, batch_id: str) -> None:
    """Move ``batch_id`` to cancelling (if it is validating or in progress), drop its queue, request its finalize."""
    with rt.store.transaction() as s:
        s.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status.in_(CANCELLABLE))
            .values(status=BatchStatus.cancelling.value, cancelling_at=int(time.time()))
        )
    rt.queue.drop_batch(batch_id)
    request_finalize(rt, batch_id)
