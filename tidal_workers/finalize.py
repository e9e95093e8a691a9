"""Finalize: close a batch whose work is over, writing its output and error files.

Two sides. Anyone may *request* a finalize (``request_finalize``, ``request_finalize_if_due``): a GPU node's item
path, its renewal thread and the API's cancel only send the ops worker a message. Only the ops worker and beat's
sweeps *perform* one: ``perform_finalize`` (the message's task, and reconcile for a batch whose work is over),
``finish_finalizing`` (reconcile, for a finalizer that died) and ``expire`` (the expiry sweep). The files are the
slowest thing a batch write does, so they are never written on the claim path or inside an HTTP request.

in_progress → finalizing → completed when every item is done; cancelling →
cancelled once nothing is in flight; in_progress → expired past expires_at.
Pending items of a cancelled or expired batch become batch_cancelled /
batch_expired error lines. Several workers and sweeps may race here, so each
move is a conditional UPDATE of the batch's status: exactly one caller
wins, and everything else it writes commits (or not) with that UPDATE. The
files' bytes are written before that transaction (``_snapshot``), so it stays
short: SQLite's one write lock is not held while a large file is written. A
caller that loses deletes its blobs.

Attempts at a `finalizing` batch's files are counted in SQL before each one starts (``batches.finalize_attempts``),
so one whose process dies (killed, out of memory) counts too; reconcile starts the next (``retry_due``). After
``TIDAL_FINALIZE_ATTEMPTS`` the batch fails with ``finalize_failed`` instead of being tried on every pass for ever,
its items' results kept in SQL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import typing as t

from sqlalchemy import bindparam
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.orm import Session

from config import Settings
from tidal_workers import quotas
from tidal_workers import task_names
from tidal_workers.runtime import Runtime
from tidal_workers.store.db import rows_updated
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

ROWS = 2000  # most item rows one fetch holds
#: Most response-body characters one fetch holds: an answer can be tens of MB (logprobs), so rows are fetched in
#: groups bounded by their bodies' length as well as their number.
FETCH_CHARS = 32 * 2**20

FINALIZE_FAILED = "finalize_failed"
#: What a body's raw line breaks are written as: CR and LF stand only between JSON's tokens, the rest only in strings.
LINE_BREAKS = (("\r", " "), ("\n", " "), ("\x85", "\\u0085"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))

log = logging.getLogger(__name__)

PENDING_ERRORS = {
    ItemStatus.cancelled: ("batch_cancelled", "This request was not executed because the batch was cancelled."),
    ItemStatus.expired: ("batch_expired", "This request could not be executed before the completion window expired."),
}


def line(item: Item, pending_as: ItemStatus | None = None) -> bytes:
    """One line of an output or error file, in OpenAI's format; a pending item as ``pending_as`` records it.

    The engine's body is spliced in as the JSON text it was recorded as (``submit`` checked it parses), never parsed
    again: a body can be tens of MB. JSON holds no raw CR or LF inside a string, so any there is whitespace, and
    becomes a space to keep the line one line. It does hold U+0085, U+2028 and U+2029 raw inside strings (vLLM writes
    them so, and a random-weight model's text carries them), where ``str.splitlines`` and the readers built on it cut
    the line: they are written as their JSON escapes, the same string.
    """
    response = "null"
    if item.response_status is not None:
        body = item.response_body or "null"
        for raw, written in LINE_BREAKS:
            body = body.replace(raw, written)
        request_id = json.dumps(item.request_id or "")
        response = f'{{"status_code": {int(item.response_status)}, "request_id": {request_id}, "body": {body}}}'
    code, message = item.error_code, item.error_message
    if pending_as is not None and item.status == ItemStatus.pending.value:
        code, message = PENDING_ERRORS[pending_as]
    error = "null"
    if code is not None:
        error = json.dumps({"code": code, "message": message or ""})
    custom_id = json.dumps(item.custom_id)
    return f'{{"id": "{request_id_of(item)}", "custom_id": {custom_id}, "response": {response}, "error": {error}}}\n'.encode()


def request_id_of(item: Item) -> str:
    """The line's ``batch_req_`` id: a hash of the batch's id and the line's number, stable across finalize attempts.
    Not the row id, which counts every item of every tenant and so would tell each tenant the fleet's volume."""
    return "batch_req_" + hashlib.sha256(f"{item.batch_id}:{item.line}".encode()).hexdigest()[:24]


def fetch_groups(sizes: t.Iterable[tuple[int, int]], max_chars: int, max_rows: int) -> t.Iterator[list[int]]:
    """The ids of ``(id, body length)`` pairs, in order, in groups of at most ``max_rows`` whose bodies sum to at most
    ``max_chars`` (a body longer than that alone is a group of one)."""
    group: list[int] = []
    held = 0
    for item_id, chars in sizes:
        if group and (held + chars > max_chars or len(group) == max_rows):
            yield group
            group, held = [], 0
        group.append(item_id)
        held += chars
    if group:
        yield group


def _move(session: Session, batch_id: str, frm: BatchStatus, to: BatchStatus, now: int) -> bool:
    """The election: True for the one caller whose conditional UPDATE moved the batch."""
    stmt = (
        update(Batch)
        .where(Batch.id == batch_id, Batch.status == frm.value)
        .values(status=to.value, **{f"{to.value}_at": now})
    )
    return rows_updated(session, stmt) == 1


class _Blob(t.NamedTuple):
    name: str
    bytes: int
    lines: int


def _write_blob(rt: Runtime, rows: t.Iterable[Item], pending_as: ItemStatus | None) -> _Blob | None:
    """One file's lines written to a blob; None (nothing kept) when there is no line: OpenAI leaves output_file_id /
    error_file_id null then."""
    count = 0

    def lines() -> t.Iterator[bytes]:
        nonlocal count
        for item in rows:
            count += 1
            yield line(item, pending_as)

    name, size, _ = rt.blobs.write_lines(lines())
    if not count:
        rt.blobs.delete(name)
        return None
    return _Blob(name, size, count)


def _add_file(
    session: Session, settings: Settings, batch: Batch, kind: str, blob: _Blob | None, now: int
) -> str | None:
    """The File row of a blob ``_write_blob`` wrote; its id."""
    if blob is None:
        return None
    f = File(
        tenant_id=batch.tenant_id,
        filename=f"{batch.id}_{kind}.jsonl",
        purpose="batch_output",
        bytes=blob.bytes,
        lines=blob.lines,
        created_at=now,
        expires_at=now + (batch.output_expires_after or settings.file_expiry_seconds),  # the batch's policy
        blob=blob.name,
    )
    session.add(f)
    session.flush()
    return f.id


def _check_storage(rt: Runtime, session: Session, batch: Batch) -> None:
    """Once a batch's files are added, before they commit: they count against its tenant's stored bytes as any file,
    and are kept even past the limit, since they hold the only copy of work done and billed. A tenant past it is
    refused new uploads and batches until it frees room (``quotas``); the operator is told here."""
    stored, limit = quotas.storage_use(session, rt.settings, batch.tenant_id)
    if stored > limit:
        log.warning(
            "batch %s: its files take tenant %s to %d stored bytes, past its limit of %d; written anyway, its new "
            "uploads and batches are refused until it frees room",
            batch.id,
            batch.tenant_id,
            stored,
            limit,
        )


def _items(session: Session, batch_id: str, completed: bool) -> t.Iterator[Item]:
    """The batch's items of one file, in line order, fetched in groups bounded in rows and in body length."""
    status = Item.status == ItemStatus.completed.value if completed else Item.status != ItemStatus.completed.value
    # Ids and lengths only: small, so held whole while the groups are fetched.
    query = select(Item.id, func.coalesce(func.length(Item.response_body), 0)).where(Item.batch_id == batch_id, status)
    sizes = session.execute(query.order_by(Item.line)).tuples().all()
    for ids in fetch_groups(sizes, FETCH_CHARS, ROWS):
        yield from session.scalars(select(Item).where(Item.id.in_(ids)).order_by(Item.line))


#: Snapshots a settle takes before it gives up until its next call (an in-flight result landed during each).
SNAPSHOT_TRIES = 3

KINDS = (("output", True), ("error", False))


class _Changed(Exception):
    """An item settled while the files were written: they no longer match SQL."""


class _Snapshot(t.NamedTuple):
    pending: int  # the batch's pending items when the files were read
    blobs: dict[str, _Blob | None]  # kind → its file's blob


def _snapshot(rt: Runtime, batch_id: str, frm: BatchStatus, pending_as: ItemStatus | None) -> _Snapshot | None:
    """Write the batch's files from what SQL holds now, outside any write transaction (a 200 MB output file takes
    seconds: SQLite's only write lock is not held for them); None if the batch is not ``frm``.

    The pending items are counted first: they only ever leave `pending`, so if the electing transaction settles
    as many, none settled in between, and the files match what it commits. A batch that never started (cancelled
    or expired in `validating`) has no files: any item rows it has are a stopped ingest's (``ingest._abandoned``).
    """
    blobs: dict[str, _Blob | None] = {kind: None for kind, _ in KINDS}
    with rt.store.read() as s:
        batch = s.get(Batch, batch_id)
        if batch is None or batch.status != frm.value:
            return None
        if batch.in_progress_at is None:
            return _Snapshot(0, blobs)
        pending = s.scalar(
            select(func.count()).where(Item.batch_id == batch_id, Item.status == ItemStatus.pending.value)
        )
        try:
            for kind, completed in KINDS:
                blobs[kind] = _write_blob(rt, _items(s, batch_id, completed), pending_as)
        except BaseException:
            _delete(rt, blobs)
            raise
    return _Snapshot(pending or 0, blobs)


def _delete(rt: Runtime, blobs: dict[str, _Blob | None]) -> None:
    for blob in blobs.values():
        if blob is not None:
            rt.blobs.delete(blob.name)


def _close(rt: Runtime, batch_id: str, frm: BatchStatus, to: BatchStatus, pending_as: ItemStatus | None = None) -> bool:
    """Move frm → to with both files, written first (``_snapshot``) and committed with the move in one short
    transaction; False if another caller won (its blobs deleted: no orphan is left behind)."""
    for _ in range(SNAPSHOT_TRIES):
        now = int(time.time())
        snap = _snapshot(rt, batch_id, frm, pending_as)
        if snap is None:
            return False
        try:
            moved = _commit(rt, batch_id, frm, to, pending_as, snap, now)
        except _Changed:
            _delete(rt, snap.blobs)
            continue
        except BaseException:  # nothing committed
            _delete(rt, snap.blobs)
            raise
        if not moved:
            _delete(rt, snap.blobs)
            return False
        rt.queue.drop_batch(batch_id)
        return True
    log.warning("batch %s: its items kept settling while its files were written; the next pass settles it", batch_id)
    return False


def _commit(
    rt: Runtime,
    batch_id: str,
    frm: BatchStatus,
    to: BatchStatus,
    pending_as: ItemStatus | None,
    snap: _Snapshot,
    now: int,
) -> bool:
    """The electing transaction: pending items settled as ``pending_as``, the move, the files' rows. Raises
    ``_Changed`` (rolled back) if an item settled since the snapshot; False (nothing changed) if the move lost."""
    with rt.store.transaction() as s:
        # Items before the batch row, in the order result writes take them: the two never deadlock on PostgreSQL.
        if pending_as is not None and snap.pending:
            code, message = PENDING_ERRORS[pending_as]
            settled = rows_updated(
                s,
                update(Item)
                .where(Item.batch_id == batch_id, Item.status == ItemStatus.pending.value)
                .values(status=pending_as.value, error_code=code, error_message=message, finished_at=now),
            )
            if settled != snap.pending:
                raise _Changed(batch_id)
        if not _move(s, batch_id, frm, to, now):
            s.rollback()
            return False
        batch = s.get_one(Batch, batch_id)
        file_ids = {
            f"{kind}_file_id": _add_file(s, rt.settings, batch, kind, snap.blobs[kind], now) for kind, _ in KINDS
        }
        _check_storage(rt, s, batch)
        s.execute(update(Batch).where(Batch.id == batch_id).values(**file_ids))
    return True


def _complete(rt: Runtime, batch_id: str) -> bool:
    """in_progress → finalizing (visible while the files are written) → completed."""
    with rt.store.transaction() as s:
        if not _move(s, batch_id, BatchStatus.in_progress, BatchStatus.finalizing, int(time.time())):
            return False
    return finish_finalizing(rt, batch_id)


def finish_finalizing(rt: Runtime, batch_id: str) -> bool:
    """finalizing → completed, in one counted attempt; also how the reconcile sweep finishes a finalizer that died.
    Once ``TIDAL_FINALIZE_ATTEMPTS`` are used up: finalizing → failed (``_give_up``)."""
    attempts = _count_attempt(rt, batch_id)
    if attempts is None:
        return False
    if attempts >= rt.settings.finalize_attempts:
        return _give_up(rt, batch_id, attempts)
    return _close(rt, batch_id, BatchStatus.finalizing, BatchStatus.completed)


def retry_due(settings: Settings, finalizing_at: float, attempts: int) -> float:
    """When reconcile starts the next attempt at a `finalizing` batch's files (or gives up, after the last):
    ``reconcile_seconds`` after it began finalizing, then doubling (+R, +3R, +7R, ...), so a fault that passes
    (the blob store restarting) costs few attempts and a batch that kills its finalizer fails in bounded time."""
    return finalizing_at + settings.reconcile_seconds * (2 ** max(attempts, 1) - 1)


def _count_attempt(rt: Runtime, batch_id: str) -> int | None:
    """Count one attempt at a `finalizing` batch's files, committed before it starts; returns the attempts made
    before it, or None if the batch is not finalizing (another caller finished it, or is counting now). Once they
    are used up, nothing more is counted."""
    finalizing = (Batch.id == batch_id, Batch.status == BatchStatus.finalizing.value)
    with rt.store.transaction() as s:
        attempts = s.scalar(select(Batch.finalize_attempts).where(*finalizing))
        if attempts is None or attempts >= rt.settings.finalize_attempts:
            return attempts
        stmt = update(Batch).where(*finalizing, Batch.finalize_attempts == attempts)
        counted = rows_updated(s, stmt.values(finalize_attempts=attempts + 1))
    return attempts if counted else None


def _give_up(rt: Runtime, batch_id: str, attempts: int) -> bool:
    """finalizing → failed with ``finalize_failed`` in its ``errors``: no file is written; request_counts, usage and
    every item's result stay in SQL (items until ``TIDAL_ITEM_RETENTION_SECONDS``), so the files can be written
    again once the cause is fixed (docs/reliability.md, "Attempt caps")."""
    message = (
        f"The batch's output and error files could not be written: {attempts} attempts failed (each raised an error "
        "or its process stopped before it finished). The results of its requests are kept; the service's operator "
        "can write the files again."
    )
    error = {"code": FINALIZE_FAILED, "line": None, "message": message, "param": None}
    now = int(time.time())
    with rt.store.transaction() as s:
        stmt = update(Batch).where(Batch.id == batch_id, Batch.status == BatchStatus.finalizing.value)
        failed = rows_updated(s, stmt.values(status=BatchStatus.failed.value, failed_at=now, errors=[error])) == 1
    if failed:
        rt.queue.drop_batch(batch_id)
        log.error("batch %s failed: its files could not be written in %d attempts", batch_id, attempts)
    return failed


def expire(rt: Runtime, batch_id: str) -> bool:
    """in_progress → expired: finished items keep their lines, the rest become batch_expired."""
    rt.queue.drop_batch(batch_id)
    return _close(rt, batch_id, BatchStatus.in_progress, BatchStatus.expired, ItemStatus.expired)


#: The columns that say whether a batch's work is over; the result write's counter UPDATE returns them.
COUNTS = (Batch.status, Batch.total, Batch.completed, Batch.failed)


class Counts(t.NamedTuple):
    """A batch's ``COUNTS``, as read (``_counts``) or returned by the result write's counter UPDATE."""

    status: str
    total: int
    completed: int
    failed: int


#: Read where no write returned them (``request_finalize_if_due``): built once, bound at each execution.
_COUNTS = select(*COUNTS).where(Batch.id == bindparam("batch_id"))


def _counts(rt: Runtime, batch_id: str) -> Counts | None:
    with rt.store.driver_transaction() as cursor:
        row = rt.store.driver(_COUNTS).one_or_none(cursor, {"batch_id": batch_id})
    return Counts(*row) if row is not None else None


def _work_over(row: Counts) -> bool:
    return row.status == BatchStatus.in_progress.value and row.completed + row.failed >= row.total


def looks_due(row: Counts | None) -> bool:
    """From a batch's ``COUNTS``: its work looks over (every item settled, or the batch cancelling), so the ops
    worker should look (``perform_finalize``)."""
    return row is not None and (_work_over(row) or row.status == BatchStatus.cancelling.value)


def perform_finalize(rt: Runtime, batch_id: str) -> bool:
    """Finalize ``batch_id`` if its work is over: all items done, or cancelling with nothing in flight; True if
    this call closed it. The ops worker's side (the ``tidal.finalize`` task and reconcile)."""
    row = _counts(rt, batch_id)
    if row is None:
        return False
    if _work_over(row):
        return _complete(rt, batch_id)
    if row.status == BatchStatus.cancelling.value and rt.queue.batch_inflight(batch_id) == 0:
        return _close(rt, batch_id, BatchStatus.cancelling, BatchStatus.cancelled, ItemStatus.cancelled)
    return False


def request_finalize(rt: Runtime, batch_id: str) -> None:
    """Ask the ops worker to run ``perform_finalize``: a GPU node's claim path and the API never write a batch's
    files."""
    rt.celery.send_task(task_names.FINALIZE, (batch_id,), queue=task_names.OPS_QUEUE)


def request_finalize_if_due(rt: Runtime, batch_id: str) -> bool:
    """Where an attempt ends without writing (abandoned, dropped): one read, and a finalize request if the batch's
    work looks over; True if sent. A result write asks on its own (``result.commit_and_release``)."""
    due = looks_due(_counts(rt, batch_id))
    if due:
        request_finalize(rt, batch_id)
    return due


__all__ = [
    "COUNTS",
    "FINALIZE_FAILED",
    "Counts",
    "expire",
    "finish_finalizing",
    "line",
    "looks_due",
    "perform_finalize",
    "request_finalize",
    "request_finalize_if_due",
    "retry_due",
]
