"""Cancel: stop a batch's claims at once, then finalize it as cancelled.

Queued items are dropped from Redis immediately; items already in flight finish
(their results are kept) or are abandoned (a lease that expires is not
requeued). The batch becomes cancelled right away if nothing is in flight,
otherwise when its last in-flight item settles, or when the reconcile sweep
notices nothing is left in flight.
"""

from __future__ import annotations

import time

from sqlalchemy import update

from tidal_workers.finalize import maybe_finalize
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus

CANCELLABLE = (BatchStatus.validating.value, BatchStatus.in_progress.value)


def cancel_batch(rt: Runtime, batch_id: str) -> None:
    """Move ``batch_id`` to cancelling (if it is validating or in progress), drop its queue, maybe finalize."""
    with rt.store.transaction() as s:
        s.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status.in_(CANCELLABLE))
            .values(status=BatchStatus.cancelling.value, cancelling_at=int(time.time()))
        )
    rt.queue.drop_batch(batch_id)
    maybe_finalize(rt, batch_id)
