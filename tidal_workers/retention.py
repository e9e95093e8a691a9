"""Retention: what Tidal deletes, and when. Beat's retention sweep runs ``sweep``; the API's file delete runs
``purge_contents``.

- A file past its ``expires_at`` is deleted, bytes and row (a file deleted through the API kept a tombstone row
  so cursors naming it still work; the tombstone goes at its expiry too).
- Deleting a file, or its expiry, purges the copies of its contents that items hold: an input file's prompts
  (``items.body`` of its batches' settled items; items still pending keep theirs until they settle, and a later
  sweep purges them), an output file's responses, an error file's error bodies and messages.
- A finished batch's item rows are deleted ``TIDAL_ITEM_RETENTION_SECONDS`` after it finished; its counts and
  usage stay on the batch row, its lines in its output and error files.
- A finished batch's ``metadata`` and validation ``errors`` (which quote lines) are cleared
  ``TIDAL_BATCH_RETENTION_SECONDS`` after it finished (never, by default). Its row stays: OpenAI lists batches
  without end, and the API's counters (items completed, tokens harvested) are sums over batch rows.
- Idempotency keys older than 24 hours are forgotten.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import typing as t

from sqlalchemy import and_
from sqlalchemy import delete
from sqlalchemy import exists
from sqlalchemy import func
from sqlalchemy import null
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.orm import Session

from tidal_workers.runtime import Runtime
from tidal_workers.store.db import rows_updated
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import IdempotencyKey
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

ROWS = 500  # files per transaction; item rows go by batch
IDEMPOTENCY_SECONDS = 24 * 3600
FINISHED = (
    BatchStatus.completed.value,
    BatchStatus.failed.value,
    BatchStatus.expired.value,
    BatchStatus.cancelled.value,
)
PURGED = ""  # what a purged prompt reads as (items.body is not nullable)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RetentionReport:
    expired_files: list[str] = dataclasses.field(default_factory=list)  # ids whose bytes and row were deleted
    freed_bytes: int = 0
    purged_items: int = 0  # item rows whose prompt or response was purged
    deleted_items: int = 0  # item rows of finished batches deleted
    cleared_batches: int = 0  # finished batches whose metadata and errors were cleared
    forgotten_keys: int = 0  # idempotency keys past 24 h


SETTLED = Item.status != ItemStatus.pending.value
ERRORED = Item.status.not_in((ItemStatus.pending.value, ItemStatus.completed.value))  # error-file lines


def _purge(session: Session, batches: t.Any, which: t.Any, values: dict[str, t.Any]) -> int:
    """Set ``values`` on the items of ``batches`` matching ``which``; returns how many rows changed."""
    stmt = update(Item).where(Item.batch_id.in_(batches), which).values(**values)
    return rows_updated(session, stmt.execution_options(synchronize_session=False))


def purge_contents(session: Session, f: File) -> int:
    """Erase what items hold of ``f``'s contents; returns the item rows changed."""
    if f.purpose == "batch":  # an input file: its batches' prompts
        inputs = select(Batch.id).where(Batch.input_file_id == f.id, Batch.tenant_id == f.tenant_id)
        return _purge(session, inputs, and_(SETTLED, Item.body != PURGED), {"body": PURGED})
    if f.purpose != "batch_output":
        return 0
    outputs = select(Batch.id).where(Batch.output_file_id == f.id, Batch.tenant_id == f.tenant_id)
    errors = select(Batch.id).where(Batch.error_file_id == f.id, Batch.tenant_id == f.tenant_id)
    return _purge(
        session,
        outputs,
        and_(Item.status == ItemStatus.completed.value, Item.response_body.is_not(None)),
        {"response_body": None},
    ) + _purge(
        session,
        errors,
        and_(ERRORED, or_(Item.response_body.is_not(None), Item.error_message.is_not(None))),
        {"response_body": None, "error_message": None},
    )


def delete_expired_files(rt: Runtime, now: int, report: RetentionReport) -> None:
    """Every file past ``expires_at``: contents purged from items, bytes deleted, then the row."""
    while True:
        with rt.store.transaction() as s:
            due = list(s.scalars(select(File).where(File.expires_at <= now).order_by(File.expires_at).limit(ROWS)))
            for f in due:
                report.purged_items += purge_contents(s, f)
                if not f.deleted:
                    rt.blobs.delete(f.blob)  # before the row: a crash between leaves a row the next sweep retries
                    report.freed_bytes += f.bytes
                s.delete(f)
                report.expired_files.append(f.id)
                log.info("file %s of tenant %s expired: bytes and row deleted", f.id, f.tenant_id)
        if len(due) < ROWS:
            return


def purge_deleted_inputs(rt: Runtime, report: RetentionReport) -> None:
    """Prompts of items settled since their input file was deleted or expired."""
    gone = or_(
        ~exists().where(File.id == Batch.input_file_id),
        exists().where(File.id == Batch.input_file_id, File.deleted.is_(True)),
    )
    with rt.store.transaction() as s:
        report.purged_items += _purge(
            s, select(Batch.id).where(gone), and_(SETTLED, Item.body != PURGED), {"body": PURGED}
        )


FINISHED_AT = func.coalesce(Batch.completed_at, Batch.failed_at, Batch.expired_at, Batch.cancelled_at)


def delete_finished_items(rt: Runtime, now: int, report: RetentionReport) -> None:
    """Item rows of batches finished ``item_retention_seconds`` ago or more."""
    cutoff = now - rt.settings.item_retention_seconds
    with rt.store.read() as s:
        due = list(
            s.scalars(
                select(Batch.id).where(
                    Batch.status.in_(FINISHED), cutoff >= FINISHED_AT, exists().where(Item.batch_id == Batch.id)
                )
            )
        )
    for batch_id in due:
        with rt.store.transaction() as s:
            stmt = delete(Item).where(Item.batch_id == batch_id).execution_options(synchronize_session=False)
            report.deleted_items += rows_updated(s, stmt)


def clear_finished_batches(rt: Runtime, now: int, report: RetentionReport) -> None:
    """Metadata and errors of batches finished ``batch_retention_seconds`` ago or more (0: never)."""
    if rt.settings.batch_retention_seconds <= 0:
        return
    with rt.store.transaction() as s:
        stmt = (
            update(Batch)
            .where(
                Batch.status.in_(FINISHED),
                now - rt.settings.batch_retention_seconds >= FINISHED_AT,
                or_(Batch.metadata_.is_not(None), Batch.errors.is_not(None)),
            )
            .values(metadata_=null(), errors=null())  # SQL NULL: a JSON column stores None as JSON null
            .execution_options(synchronize_session=False)
        )
        report.cleared_batches += rows_updated(s, stmt)


def forget_idempotency_keys(rt: Runtime, now: int, report: RetentionReport) -> None:
    with rt.store.transaction() as s:
        stmt = delete(IdempotencyKey).where(IdempotencyKey.created_at <= now - IDEMPOTENCY_SECONDS)
        report.forgotten_keys += rows_updated(s, stmt)


def sweep(rt: Runtime, now: float | None = None) -> RetentionReport:
    """One retention pass (idempotent); what it deleted is logged and returned."""
    at = int(time.time() if now is None else now)
    report = RetentionReport()
    delete_expired_files(rt, at, report)
    purge_deleted_inputs(rt, report)
    delete_finished_items(rt, at, report)
    clear_finished_batches(rt, at, report)
    forget_idempotency_keys(rt, at, report)
    if (
        report.expired_files
        or report.purged_items
        or report.deleted_items
        or report.cleared_batches
        or report.forgotten_keys
    ):
        log.info(
            "retention: %d expired files deleted (%d bytes), %d items purged, %d item rows deleted, %d batches "
            "cleared, %d idempotency keys forgotten",
            len(report.expired_files),
            report.freed_bytes,
            report.purged_items,
            report.deleted_items,
            report.cleared_batches,
            report.forgotten_keys,
        )
    return report


__all__ = ["RetentionReport", "delete_expired_files", "purge_contents", "sweep"]
