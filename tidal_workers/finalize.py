"""Finalize: settle a batch whose work is over, writing its output and error files.

in_progress → finalizing → completed when every item is done; cancelling →
cancelled once nothing is in flight; in_progress → expired past expires_at.
Pending items of a cancelled or expired batch become batch_cancelled /
batch_expired error lines. Several workers and sweeps may race here, so each
move starts with a conditional UPDATE of the batch's status: exactly one caller
wins, and everything else it writes commits (or not) with that UPDATE.
"""

from __future__ import annotations

import json
import time
import typing as t

from sqlalchemy import bindparam
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.orm import Session

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

PENDING_ERRORS = {
    ItemStatus.cancelled: ("batch_cancelled", "This request was not executed because the batch was cancelled."),
    ItemStatus.expired: ("batch_expired", "This request could not be executed before the completion window expired."),
}


def line(item: Item) -> bytes:
    """One line of an output or error file, in OpenAI's format.

    The engine's body is spliced in as the JSON text it was recorded as (``submit`` checked it parses), never parsed
    again: a body can be tens of MB. JSON holds no raw line break inside a string, so any there is whitespace, and
    becomes a space to keep the line one line.
    """
    response = "null"
    if item.response_status is not None:
        body = (item.response_body or "null").replace("\r", " ").replace("\n", " ")
        request_id = json.dumps(item.request_id or "")
        response = f'{{"status_code": {int(item.response_status)}, "request_id": {request_id}, "body": {body}}}'
    error = "null"
    if item.error_code is not None:
        error = json.dumps({"code": item.error_code, "message": item.error_message or ""})
    custom_id = json.dumps(item.custom_id)
    return f'{{"id": "batch_req_{item.id}", "custom_id": {custom_id}, "response": {response}, "error": {error}}}\n'.encode()


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


def _write_file(
    rt: Runtime, session: Session, batch: Batch, kind: str, rows: t.Iterable[Item], now: int
) -> File | None:
    count = 0

    def lines() -> t.Iterator[bytes]:
        nonlocal count
        for item in rows:
            count += 1
            yield line(item)

    name, size, _ = rt.blobs.write_lines(lines())
    if not count:  # OpenAI leaves output_file_id / error_file_id null when there is nothing to put in them
        rt.blobs.delete(name)
        return None
    f = File(
        tenant_id=batch.tenant_id,
        filename=f"{batch.id}_{kind}.jsonl",
        purpose="batch_output",
        bytes=size,
        lines=count,
        created_at=now,
        expires_at=now + (batch.output_expires_after or rt.settings.file_expiry_seconds),  # the batch's policy
        blob=name,
    )
    session.add(f)
    session.flush()
    return f


def _items(session: Session, batch_id: str, completed: bool) -> t.Iterator[Item]:
    """The batch's items of one file, in line order, fetched in groups bounded in rows and in body length."""
    status = Item.status == ItemStatus.completed.value if completed else Item.status != ItemStatus.completed.value
    # Ids and lengths only: small, so held whole while the groups are fetched.
    query = select(Item.id, func.coalesce(func.length(Item.response_body), 0)).where(Item.batch_id == batch_id, status)
    sizes = session.execute(query.order_by(Item.line)).tuples().all()
    for ids in fetch_groups(sizes, FETCH_CHARS, ROWS):
        yield from session.scalars(select(Item).where(Item.id.in_(ids)).order_by(Item.line))


def _settle(
    rt: Runtime, batch_id: str, frm: BatchStatus, to: BatchStatus, pending_as: ItemStatus | None = None
) -> bool:
    """Move frm → to and write both files in one transaction; False if another caller won."""
    now = int(time.time())
    written: list[str] = []
    try:
        with rt.store.transaction() as s:
            # Items before the batch row, in the order result writes take them: the two never deadlock on
            # PostgreSQL. A caller that then loses the election rolls its item changes back.
            if pending_as is not None:
                code, message = PENDING_ERRORS[pending_as]
                s.execute(
                    update(Item)
                    .where(Item.batch_id == batch_id, Item.status == ItemStatus.pending.value)
                    .values(status=pending_as.value, error_code=code, error_message=message, finished_at=now)
                )
            if not _move(s, batch_id, frm, to, now):
                return False
            batch = s.get(Batch, batch_id)
            assert batch is not None  # the UPDATE above just moved it
            file_ids = {}
            for kind, completed in (("output", True), ("error", False)):
                f = _write_file(rt, s, batch, kind, _items(s, batch_id, completed), now)
                if f is not None:
                    written.append(f.blob)
                file_ids[f"{kind}_file_id"] = f.id if f is not None else None
            s.execute(update(Batch).where(Batch.id == batch_id).values(**file_ids))
    except BaseException:  # nothing committed: leave no orphan blobs behind
        for blob in written:
            rt.blobs.delete(blob)
        raise
    rt.queue.drop_batch(batch_id)
    return True


def complete(rt: Runtime, batch_id: str) -> bool:
    """in_progress → finalizing (visible while the files are written) → completed."""
    with rt.store.transaction() as s:
        if not _move(s, batch_id, BatchStatus.in_progress, BatchStatus.finalizing, int(time.time())):
            return False
    return finish_finalizing(rt, batch_id)


def finish_finalizing(rt: Runtime, batch_id: str) -> bool:
    """finalizing → completed; also how the reconcile sweep finishes a finalizer that died."""
    return _settle(rt, batch_id, BatchStatus.finalizing, BatchStatus.completed)


def expire(rt: Runtime, batch_id: str) -> bool:
    """in_progress → expired: finished items keep their lines, the rest become batch_expired."""
    rt.queue.drop_batch(batch_id)
    return _settle(rt, batch_id, BatchStatus.in_progress, BatchStatus.expired, ItemStatus.expired)


#: The columns that say whether a batch's work is over; the result write's counter UPDATE returns them.
COUNTS = (Batch.status, Batch.total, Batch.completed, Batch.failed)


class Counts(t.NamedTuple):
    """A batch's ``COUNTS``, as read (``_counts``) or returned by the result write's counter UPDATE."""

    status: str
    total: int
    completed: int
    failed: int


#: Read where no write returned them (``finalize_if_due``): built once, bound at each execution.
_COUNTS = select(*COUNTS).where(Batch.id == bindparam("batch_id"))


def _counts(rt: Runtime, batch_id: str) -> Counts | None:
    with rt.store.core_read() as s:
        row = s.execute(_COUNTS, {"batch_id": batch_id}).one_or_none()
    return Counts(*row) if row is not None else None


def _work_over(row: Counts) -> bool:
    return row.status == BatchStatus.in_progress.value and row.completed + row.failed >= row.total


def looks_due(row: Counts | None) -> bool:
    """From a batch's ``COUNTS``: its work looks over (every item settled, or the batch cancelling), so the ops
    worker's ``maybe_finalize`` should look."""
    return row is not None and (_work_over(row) or row.status == BatchStatus.cancelling.value)


def maybe_finalize(rt: Runtime, batch_id: str) -> bool:
    """Finalize ``batch_id`` if its work is over: all items done, or cancelling with nothing in flight."""
    row = _counts(rt, batch_id)
    if row is None:
        return False
    if _work_over(row):
        return complete(rt, batch_id)
    if row.status == BatchStatus.cancelling.value and rt.queue.batch_inflight(batch_id) == 0:
        return _settle(rt, batch_id, BatchStatus.cancelling, BatchStatus.cancelled, ItemStatus.cancelled)
    return False


def request_finalize(rt: Runtime, batch_id: str) -> None:
    """Ask the ops worker to run ``maybe_finalize``: a GPU node's claim path never writes a batch's files."""
    rt.celery.send_task(task_names.FINALIZE, (batch_id,), queue=task_names.OPS_QUEUE)


def finalize_if_due(rt: Runtime, batch_id: str) -> bool:
    """Where an attempt ends without writing (abandoned, dropped): one read, and a finalize request if the batch's
    work looks over; True if sent. A result write asks on its own (``result.settle``)."""
    due = looks_due(_counts(rt, batch_id))
    if due:
        request_finalize(rt, batch_id)
    return due


__all__ = [
    "COUNTS",
    "Counts",
    "complete",
    "expire",
    "finalize_if_due",
    "finish_finalizing",
    "line",
    "looks_due",
    "maybe_finalize",
    "request_finalize",
]
