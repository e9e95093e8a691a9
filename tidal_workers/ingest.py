"""Ingest: validate a `validating` batch's input file and turn its lines into Item rows.

Runs inline in ``POST /v1/batches`` for small files and as the Celery task
``tidal.ingest`` for large ones. Either way it is idempotent: only a batch still
``validating`` is touched, and the status change and the item rows commit in
one transaction, so a redelivered task finds the batch moved on and does nothing.
That is also why a task the broker never took is simply sent again: the batch
row in SQL is the record that ingest is owed (``request_ingest``, and beat's
reconcile for batches left ``validating``).
"""

from __future__ import annotations

import logging
import time
import typing as t

from kombu.exceptions import OperationalError
from sqlalchemy import insert
from sqlalchemy import update
from sqlalchemy.orm import Session

from tidal_workers import task_names
from tidal_workers.blobs import BlobNotFound
from tidal_workers.enqueue import enqueue_batch
from tidal_workers.quotas import lock_tenant
from tidal_workers.quotas import token_limit_message
from tidal_workers.runtime import Runtime
from tidal_workers.store.db import rows_updated
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Item
from tidal_workers.validate import LineError
from tidal_workers.validate import ParsedLine
from tidal_workers.validate import validate_file

CHUNK_ROWS = 5000

log = logging.getLogger(__name__)


def request_ingest(rt: Runtime, batch_id: str) -> bool:
    """Send ``tidal.ingest`` for a `validating` batch; False (logged) if the broker did not take it.

    Nothing is lost then: the batch stays `validating` in SQL, and beat's reconcile sends the task again once the
    batch has waited ``ingest_resend_seconds``.
    """
    try:
        rt.celery.send_task(task_names.INGEST, args=[batch_id], queue=task_names.OPS_QUEUE)
        return True
    except OperationalError as exc:
        log.warning(
            "batch %s: the broker did not take its ingest task (%s); reconcile will send it again", batch_id, exc
        )
        return False


def ordered(items: list[ParsedLine]) -> list[ParsedLine]:
    """Claim order: requests sharing a prompt prefix sit together (prefix-cache hits), then file order."""
    return sorted(items, key=lambda p: (p.prefix_key, p.line))


def _claim(session: Session, batch_id: str, **values: t.Any) -> bool:
    """Move the batch out of `validating`; False if another delivery (or a cancel) got there first."""
    stmt = update(Batch).where(Batch.id == batch_id, Batch.status == BatchStatus.validating.value).values(**values)
    return rows_updated(session, stmt) == 1


def ingest_batch(rt: Runtime, batch_id: str) -> None:
    """Validate the batch's file; then either fail the batch with its line errors, or insert its items and queue them."""
    with rt.store.transaction() as s:
        batch = s.get(Batch, batch_id)
        if batch is None or batch.status != BatchStatus.validating.value:
            return
        endpoint, tenant = batch.endpoint, batch.tenant_id
        source = s.get(File, batch.input_file_id)
        blob = None if source is None or source.deleted else source.blob

    try:
        if blob is None:
            raise BlobNotFound(batch_id)
        with rt.blobs.open(blob) as f:
            result = validate_file(f, endpoint, rt.settings)
    except BlobNotFound:
        errors = [
            LineError("file_not_found", None, "The input file was deleted before it was validated.", "input_file_id")
        ]
        model = None
    else:
        errors, model = result.errors, result.model

    now = int(time.time())
    if errors:
        with rt.store.transaction() as s:
            _claim(
                s,
                batch_id,
                status=BatchStatus.failed.value,
                failed_at=now,
                model=model,
                errors=[e.as_dict() for e in errors],
            )
        return

    assert model is not None  # a file without errors holds at least one request, so a model
    with rt.store.transaction() as s:
        lock_tenant(s, tenant)  # the quota is decided and the tokens taken in this one transaction
        if over := token_limit_message(s, rt.settings, tenant, model, result.tokens):
            error = LineError("token_limit_exceeded", None, over, None)
            _claim(s, batch_id, status=BatchStatus.failed.value, failed_at=now, model=model, errors=[error.as_dict()])
            return
        if not _claim(
            s,
            batch_id,
            status=BatchStatus.in_progress.value,
            in_progress_at=now,
            model=model,
            total=len(result.items),
            enqueued_tokens=result.tokens,
        ):
            return
        rows = [
            {
                "batch_id": batch_id,
                "line": p.line,
                "ordinal": rank,
                "custom_id": p.custom_id,
                "url": p.url,
                "body": p.body,
            }
            for rank, p in enumerate(ordered(result.items))
        ]
        for start in range(0, len(rows), CHUNK_ROWS):
            s.execute(insert(Item), rows[start : start + CHUNK_ROWS])

    enqueue_batch(rt, batch_id)
