"""Record each item's outcome in SQL exactly once, then release its lease and ask for a finalize if it was the last.

Delivery is at least once (a dead worker's item runs again), so the write is
idempotent: ``UPDATE items ... WHERE status = 'pending'`` lets the first write
win, and a result under a lease that is no longer current is dropped before it
gets there. request_counts and billed usage move in the same transaction. A
worker writes through its ``ResultWriter``: outcomes that arrive together share
one transaction, so a batch's row is updated once per group, not per item.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import typing as t
from concurrent.futures import Future

import prometheus_client
from sqlalchemy import bindparam
from sqlalchemy import update

from tidal_workers import finalize
from tidal_workers.attempt import Attempt
from tidal_workers.leases import LeaseBook
from tidal_workers.policy.pricing import Usage
from tidal_workers.runtime import Runtime
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


@dataclasses.dataclass(frozen=True)
class Entry:
    """One attempt's outcome to write."""

    attempt: Attempt
    batch_id: str
    outcome: Outcome


# The two statements of a write are built once and run on the driver's cursor (``Store.driver``): SQLAlchemy's
# building and executing them cost more than SQLite spends running them, and the release path runs them for every
# answered item.
#: The item columns a write sets (``_outcome_columns``).
_OUTCOME = (
    "status",
    "attempts",
    "response_status",
    "request_id",
    "response_body",
    "error_code",
    "error_message",
    "finished_at",
    *(f.name for f in dataclasses.fields(Usage)),  # Usage's fields are the items' (and batches') token columns
)
#: The item's conditional UPDATE (the first write wins), its outcome bound as ``set_<column>``.
_WRITE_ITEM = (
    update(Item)
    .where(Item.id == bindparam("item_id"), Item.status == ItemStatus.pending.value)
    .values({column: bindparam(f"set_{column}") for column in _OUTCOME})
)
_COUNTERS = ("completed", "failed", *(f.name for f in dataclasses.fields(Usage)))
#: A group's additions to one batch's request_counts and billed usage, bound as ``add_<column>``; it returns the
#: counts after them, which say whether the batch's work looks over (no read of the batch after each item).
_ADD_TO_BATCH = (
    update(Batch)
    .where(Batch.id == bindparam("batch_id"))
    .values({column: getattr(Batch, column) + bindparam(f"add_{column}") for column in _COUNTERS})
    .returning(*finalize.COUNTS)
)


def _outcome_columns(e: Entry, now: int) -> dict[str, t.Any]:
    """The item's columns after ``e``'s write, bound as ``set_<column>``."""
    o = e.outcome
    columns = {
        "status": o.status.value,
        "attempts": e.attempt.number,
        "response_status": o.response_status,
        "request_id": o.request_id,
        "response_body": o.body,
        "error_code": o.error_code,
        "error_message": o.error_message,
        "finished_at": now,
        **o.usage.columns(),
    }
    return {f"set_{column}": value for column, value in columns.items()}


def write_outcomes(rt: Runtime, entries: list[Entry]) -> tuple[list[bool], list[str]]:
    """Write a group of outcomes in one transaction; for each, True if it was the first write of its item, and
    the batches whose work looks over after it (``finalize.looks_due`` on the counts the counter UPDATE returns).

    Items first, then one counter UPDATE per batch (in batch-id order) for the whole group: a batch's row is
    locked once per group and only for the statement before the commit, never while each item is written.
    finalize takes items before its batch too, so the two never deadlock on PostgreSQL.
    """
    now = int(time.time())
    due: list[str] = []
    write_item, add_to_batch = rt.store.driver(_WRITE_ITEM), rt.store.driver(_ADD_TO_BATCH)
    with rt.store.driver_transaction() as cursor:
        written = [
            write_item.run(cursor, {"item_id": e.attempt.item_id, **_outcome_columns(e, now)}).rowcount == 1
            for e in entries
        ]
        counts: dict[str, list[Entry]] = {}
        for e, first in zip(entries, written):
            if first:
                counts.setdefault(e.batch_id, []).append(e)
        for batch_id in sorted(counts):
            done = [e.outcome.usage for e in counts[batch_id] if e.outcome.status is ItemStatus.completed]
            billed = sum(done, Usage())  # only completed items are billed
            additions = {"completed": len(done), "failed": len(counts[batch_id]) - len(done), **billed.columns()}
            row = add_to_batch.one_or_none(
                cursor, {"batch_id": batch_id, **{f"add_{k}": v for k, v in additions.items()}}
            )
            if finalize.looks_due(finalize.Counts(*row) if row is not None else None):
                due.append(batch_id)
    for e, first in zip(entries, written):
        if first and e.outcome.status is ItemStatus.completed:
            HARVESTED.labels("input").inc(e.outcome.usage.input_tokens)
            HARVESTED.labels("output").inc(e.outcome.usage.output_tokens)
    return written, due


def release(rt: Runtime, entries: list[Entry], due: list[str]) -> None:
    """After a group's commit: release its leases in one round trip, then ask the ops worker to finalize each batch
    whose work the write found over (``due``; after the release, as a cancelled batch waits for its last lease).
    The leases of attempts that lost the write are released too (their item is settled); stale ones are left to
    their holder."""
    rt.queue.complete_all([e.attempt for e in entries])
    for batch_id in due:
        finalize.request_finalize(rt, batch_id)


def commit_and_release(rt: Runtime, entries: list[Entry]) -> list[bool]:
    """Write a group of outcomes (``write_outcomes``), then ``release`` them: after the commit, so no lease is gone
    while its outcome is not yet durable."""
    written, due = write_outcomes(rt, entries)
    release(rt, entries, due)
    return written


#: Writes and releases one group of outcomes: ``commit_and_release`` bound to a Runtime, or a ResultWriter's group
#: commit.
Write = t.Callable[[list[Entry]], list[bool]]


def lease_current(rt: Runtime, book: LeaseBook | None, attempt: Attempt) -> bool:
    """Is the attempt's lease still the item's? The node's book answers while its last claim or renewal of the lease
    is recent enough (``LeaseBook.current``: no round trip on the way to the engine or back); Redis otherwise. The
    one lease check the item path calls."""
    return (book is not None and book.current(attempt)) or rt.queue.lease_current(attempt)


def record(rt: Runtime, entry: Entry, write: Write | None = None, book: LeaseBook | None = None) -> bool:
    """Write ``entry``'s outcome if its lease is current (``lease_current``) and the item still pending, then release
    the lease (``commit_and_release``); True if this call wrote it. ``write``: a worker's ResultWriter; by default a
    transaction of its own. ``book``: the node's LeaseBook, which answers the lease check while it vouches for it."""
    if not lease_current(rt, book, entry.attempt):
        return False
    (written,) = (write or functools.partial(commit_and_release, rt))([entry])
    return written


class ResultWriter:
    """Group commit for one worker process, led by its callers: a caller that finds no write under way writes
    at once, on its own thread, every outcome queued (its own first among them); outcomes that arrive while a
    write is under way wait, and the first of them to wake when it ends writes them all (one commit, one counter
    UPDATE per batch). A leader frees the writer for the next group as soon as its commit is done, then
    releases its group (``release``: one round trip for the group's leases) while the next group's transaction
    runs: answers that arrive in the same step no longer wait for each other's Redis round trip. Each caller
    returns once its own outcome is durable and its lease released. No thread hand-off when the writer is idle:
    that hand-off was half the release time on two busy cores."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        self._cond = threading.Condition()
        self._queue: list[tuple[Entry, Future[bool]]] = []
        self._writing = False  # a leader's transaction is under way
        self._releasing = 0  # groups committed whose leases are being released
        self._closing = False

    def write(self, entries: list[Entry]) -> list[bool]:
        if not entries:
            return []
        futures: list[Future[bool]] = [Future() for _ in entries]
        with self._cond:
            if self._closing:  # a straggler after shutdown began: its own transaction
                return commit_and_release(self.rt, entries)
            queue = self._queue  # ours until a leader takes it as its group and starts a new one
            queue += zip(entries, futures)
            while self._writing and queue is self._queue:
                self._cond.wait()
            leading = queue is self._queue
            if leading:  # lead: write everything queued so far, ours included
                self._writing = True
                self._queue = []
        if leading:  # else a leader took ours with its group and sets their futures
            self._lead(queue)
        return [f.result() for f in futures]

    def _lead(self, group: list[tuple[Entry, Future[bool]]]) -> None:
        """Write the group, free the writer for the next group, then release this one and answer its callers."""
        entries = [e for e, _ in group]
        committed = False
        try:
            written, due = write_outcomes(self.rt, entries)
            with self._cond:
                self._writing, self._releasing, committed = False, self._releasing + 1, True
                self._cond.notify_all()
            release(self.rt, entries, due)
        except BaseException as exc:  # every caller of the group sees the failure, as with its own write
            for _, future in group:
                future.set_exception(exc)
        else:
            for (_, future), first in zip(group, written):
                future.set_result(first)
        finally:
            with self._cond:
                if committed:
                    self._releasing -= 1
                else:  # the write failed: the writer is still ours to free
                    self._writing = False
                self._cond.notify_all()

    def close(self) -> None:
        """Stragglers from now on write on their own; wait (up to 30 s) for the groups being written or released."""
        with self._cond:
            self._closing = True
            self._cond.wait_for(lambda: not self._writing and not self._releasing and not self._queue, timeout=30)
