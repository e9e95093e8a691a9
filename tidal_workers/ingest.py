"""Ingest: validate a `validating` batch's input file and turn its lines into Item rows.

Runs inline in ``POST /v1/batches`` for small files and as the Celery task ``tidal.ingest`` on the ops worker's
ingest process (``tidal worker --ops``, never a GPU node's worker) for large ones. Either way it is idempotent: only
a batch still ``validating`` is touched, and its item rows become claimable only when one short transaction moves it
to ``in_progress``, so a redelivered task finds the batch moved on and does nothing. That is also why a task the
broker never took is simply sent again: the batch row in SQL is the record that ingest is owed (``request_ingest``,
and beat's reconcile for batches left ``validating``).

Memory is bounded whatever the file's size: the file is read twice as a stream. The first pass validates it and
keeps only each request's claim key (prompt prefix, line), enough to rank the requests; the second inserts them,
``CHUNK_ROWS`` rows or ``CHUNK_BYTES`` of bodies at a time, each with its rank, each chunk in its own short
transaction while the batch is still `validating` (SQLite has one write lock for the whole database: holding it for
the pass, 10-20 s for a 200 MB file, stalled every other writer). Only then does one short transaction take the
tenant's row, decide the quota and move the batch to ``in_progress``. Each chunk's transaction first checks that its
attempt is still the batch's latest (``_holds``), so an attempt presumed dead that still runs stops at its next
chunk; rows a stopped attempt leaves are deleted by the next attempt (or by itself once the batch left `validating`
without starting, ``_abandoned``), and otherwise by the item retention, as any finished batch's. A 200 MB,
50,000-line file costs a few tens of MB, not the file.

Attempts are counted in SQL before each one starts (``batches.ingest_attempts``), so an attempt whose process dies
(killed, out of memory) counts too. An attempt that raises is retried with backoff (``retry_delay``); one that died
is sent again by reconcile (``resend_due``); after ``TIDAL_INGEST_ATTEMPTS`` the batch fails with ``ingest_failed``.
An input that kills its process therefore costs a bounded number of attempts, never a loop.

One tenant runs at most ``TIDAL_INGESTS_PER_TENANT`` attempts at once on the ops worker: a message for a tenant at
its limit does nothing (no attempt counted) and its batch stays `validating`; whichever of the tenant's attempts
ends next sends the ingest of its oldest batch left waiting (``send_next``), and reconcile resends any left behind.
So one tenant's files never hold every ingest thread, and no message loops in the broker while it waits.
"""

from __future__ import annotations

import array
import io
import logging
import time
import typing as t

from kombu.exceptions import OperationalError
from sqlalchemy import delete
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.orm import Session

from config import Settings
from tidal_workers import task_names
from tidal_workers.blobs import BlobNotFound
from tidal_workers.enqueue import enqueue_batch
from tidal_workers.policy.body import CHAT
from tidal_workers.policy.body import COMPLETIONS
from tidal_workers.policy.phase import Phase
from tidal_workers.policy.phase import SplitConfig
from tidal_workers.policy.phase import split_item
from tidal_workers.quotas import lock_tenant
from tidal_workers.quotas import storage_use
from tidal_workers.quotas import token_limit_message
from tidal_workers.runtime import Runtime
from tidal_workers.store.db import rows_updated
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Item
from tidal_workers.validate import LineError
from tidal_workers.validate import ParsedLine
from tidal_workers.validate import Validation
from tidal_workers.validate import validate_file

CHUNK_ROWS = 5000
CHUNK_BYTES = 8 << 20  # request bodies per INSERT: bounds memory when the lines are long
SPLITTABLE = (CHAT, COMPLETIONS)  # Phase split: the endpoints that decode and carry the freeze tag to the engine

log = logging.getLogger(__name__)


def request_ingest(rt: Runtime, batch_id: str) -> bool:
    """Send ``tidal.ingest`` for a `validating` batch; False (logged) if the broker did not take it.

    Nothing is lost then: the batch stays `validating` in SQL, and beat's reconcile sends the task again once the
    batch has waited ``ingest_resend_seconds``.
    """
    try:
        rt.celery.send_task(task_names.INGEST, args=[batch_id], queue=task_names.INGEST_QUEUE)
        return True
    except OperationalError as exc:
        log.warning(
            "batch %s: the broker did not take its ingest task (%s); reconcile will send it again", batch_id, exc
        )
        return False


def token_error(message: str) -> dict[str, t.Any]:
    """The ``errors.data`` entry of a batch the enqueued-token quota refuses, as OpenAI writes it."""
    return LineError("token_limit_exceeded", None, message, None).as_dict()


class TokenFloor(t.NamedTuple):
    model: str
    tokens: int


def token_floor(rt: Runtime, blob: str, endpoint: str) -> TokenFloor | None:
    """A lower bound on a large input file's estimated tokens, read before its ingest is queued: the tokens of the
    whole lines in its first ``TIDAL_SYNC_VALIDATE_BYTES``, which costs what validating a small file inline does.

    Every request of a batch counts against the quota, so a batch whose first lines alone are over what its tenant
    has left would be refused by the ingest's verdict on the whole file too: it is refused at once, and costs no
    ingest. None when the prefix says nothing sure (no whole line, a line error: the ingest reports the file's
    errors) or could not be read (the ingest reads it again, and retries what fails).
    """
    try:
        with rt.blobs.open(blob) as f:
            head = f.read(rt.settings.sync_validate_bytes)
    except Exception as exc:  # a hint only: storage trouble is the ingest's to report, not the create's
        log.warning("the input file %s could not be read for its token estimate (%s); ingest decides", blob, exc)
        return None
    head = head[: head.rfind(b"\n") + 1]
    if not head:
        return None
    prefix = validate_file(io.BytesIO(head), endpoint, rt.settings)
    if prefix.errors or prefix.model is None:
        return None
    return TokenFloor(prefix.model, prefix.tokens)


def claim_key(p: ParsedLine) -> tuple[str, int]:
    """Claim order: requests sharing a prompt prefix sit together (prefix-cache hits), then file order."""
    return p.prefix_key, p.line


def retry_delay(settings: Settings, attempts: int) -> float:
    """Seconds before attempt ``attempts + 1`` when attempt ``attempts`` raised: doubling from the backoff."""
    return settings.ingest_backoff_seconds * 2 ** max(attempts - 1, 0)


def resend_due(settings: Settings, created_at: float, started_at: float | None, attempts: int) -> float:
    """When a `validating` batch's ingest is presumed lost (never delivered, or its process died): reconcile then
    sends it again, or fails the batch after the last attempt, and a new attempt may start.

    ``ingest_resend_seconds`` after the batch's creation or its last attempt's start, doubling per attempt: an
    input that kills its process is tried again later each time.
    """
    return (started_at or created_at) + settings.ingest_resend_seconds * 2 ** max(attempts - 1, 0)


def _claim(session: Session, batch_id: str, **values: t.Any) -> bool:
    """Move the batch out of `validating`; False if another delivery (or a cancel) got there first."""
    stmt = update(Batch).where(Batch.id == batch_id, Batch.status == BatchStatus.validating.value).values(**values)
    return rows_updated(session, stmt) == 1


def give_up(rt: Runtime, batch_id: str, why: str) -> bool:
    """Fail a `validating` batch whose last ingest attempt is over, with ``why`` in its ``errors.data``."""
    with rt.store.transaction() as s:
        attempts = s.scalar(select(Batch.ingest_attempts).where(Batch.id == batch_id)) or 0
        error = LineError(
            "ingest_failed",
            None,
            f"The input file could not be validated: {attempts} attempt{'s' * (attempts != 1)} failed; the last {why}.",
            None,
        )
        failed = _claim(
            s, batch_id, status=BatchStatus.failed.value, failed_at=int(time.time()), errors=[error.as_dict()]
        )
    if failed:
        log.error("batch %s failed: %s", batch_id, error.message)
    return failed


class _Attempt(t.NamedTuple):
    endpoint: str
    tenant: str
    blob: str | None  # None: the input file was deleted
    phase_split: str
    expires_at: int
    attempt: int  # this attempt's number: ``ingest_attempts`` once it is counted


#: What ``_begin_attempt`` answers when the tenant already runs its allowed attempts: the batch waits its turn.
WAIT: t.Final = "wait"


def _running(s: Session, settings: Settings, tenant: str, batch_id: str, now: float) -> int:
    """The tenant's other ingest attempts running now: begun and not yet presumed dead (``resend_due``)."""
    begun = s.execute(
        select(Batch.created_at, Batch.ingest_started_at, Batch.ingest_attempts).where(
            Batch.tenant_id == tenant,
            Batch.status == BatchStatus.validating.value,
            Batch.ingest_started_at.is_not(None),
            Batch.id != batch_id,
        )
    ).all()
    return sum(now < resend_due(settings, *row) for row in begun)


def _begin_attempt(rt: Runtime, batch_id: str, max_running: int | None) -> _Attempt | t.Literal["wait"] | None:
    """Count an attempt (committed before any work, so a process that dies mid-ingest has used it up).

    Returns what the attempt needs of the batch; ``WAIT`` when the tenant already runs ``max_running`` attempts
    (nothing counted); or None when there is nothing to do: the batch is no longer `validating`, its attempts are
    used up (reconcile fails it when the last is due), or an attempt is running (a duplicate message: the API's and
    a resend, or several resends while no ops worker ran).
    """
    now = time.time()
    with rt.store.transaction() as s:
        tenant = s.scalar(select(Batch.tenant_id).where(Batch.id == batch_id))
        if tenant is None:
            return None
        lock_tenant(s, tenant)  # the tenant's running attempts are counted, and this one added, one at a time
        batch = s.get_one(Batch, batch_id)
        if batch.status != BatchStatus.validating.value:
            return None
        attempts, started_at = batch.ingest_attempts, batch.ingest_started_at
        if attempts >= rt.settings.ingest_attempts:
            log.warning("batch %s: its %d ingest attempts are used up", batch_id, attempts)
            return None
        if started_at is not None and now < resend_due(rt.settings, batch.created_at, started_at, attempts):
            log.info("batch %s: ingest attempt %d is running; this message is a duplicate", batch_id, attempts)
            return None
        if max_running is not None and _running(s, rt.settings, tenant, batch_id, now) >= max_running:
            log.info("batch %s waits: tenant %s already runs %d ingests", batch_id, tenant, max_running)
            return WAIT
        counted = rows_updated(
            s,
            update(Batch)
            .where(
                Batch.id == batch_id,
                Batch.status == BatchStatus.validating.value,
                Batch.ingest_attempts == attempts,  # of two messages racing here, one counts its attempt
            )
            .values(ingest_attempts=attempts + 1, ingest_started_at=int(now)),
        )
        if not counted:
            return None
        source = s.get(File, batch.input_file_id)
        blob = None if source is None or source.deleted else source.blob
        return _Attempt(batch.endpoint, tenant, blob, batch.phase_split, batch.expires_at, attempts + 1)


def send_next(rt: Runtime, tenant: str, ended: str) -> None:
    """An ingest attempt of ``tenant`` (on batch ``ended``) is over: send the ingest of the tenant's oldest batch
    that waits with no attempt running, which a message found the tenant at its limit for.

    A batch whose message is still on its way may get a second one: the duplicate does nothing.
    """
    with rt.store.read() as s:
        waiting = s.scalar(
            select(Batch.id)
            .where(
                Batch.tenant_id == tenant,
                Batch.status == BatchStatus.validating.value,
                Batch.ingest_started_at.is_(None),
                Batch.id != ended,  # an attempt that raised is retried after its own backoff
            )
            .order_by(Batch.created_at, Batch.id)
            .limit(1)
        )
    if waiting is not None:
        request_ingest(rt, waiting)


def _ranks(keys: list[tuple[str, int]]) -> array.array:
    """line → rank in claim order, as a flat array indexed by line (4 bytes a line, not a dict of objects)."""
    last_line = max((line for _prefix, line in keys), default=0)
    keys.sort()
    ranks = array.array("i", bytes(4 * (last_line + 1)))
    for rank, (_prefix, line) in enumerate(keys):
        ranks[line] = rank
    return ranks


def phase_rule(
    settings: Settings, endpoint: str, mode: str, laxity_seconds: float, room: bool
) -> t.Callable[[ParsedLine], Phase]:
    """Each item's first phase (the phase split): ``prefill`` for an item ``split_item`` splits, else ``whole``.

    Nothing is split unless the engines can freeze (``TIDAL_KV_FREEZE_DIR`` names their connector's folder) and
    the endpoint generates: a split item elsewhere would only pay its prefill twice. Nor while the tenant has no
    ``room`` under its stored-bytes limit, which its frozen KV counts against.
    """
    if not (settings.kv_freeze_dir and room) or endpoint not in SPLITTABLE:
        return lambda p: Phase.WHOLE
    cfg = SplitConfig()
    return lambda p: Phase.PREFILL if split_item(mode, p.prompt_tokens, laxity_seconds, cfg) else Phase.WHOLE


class _Stopped(Exception):
    """The attempt no longer owns its batch: cancelled, expired, or a newer attempt counted (``_holds``)."""


def _holds(attempt: int) -> t.Callable[[Session, str], bool]:
    """A guard true while ``attempt`` still owns the `validating` batch: its first write holds the batch's row (on
    SQLite, the write lock) to the commit, so nothing this attempt writes commits after a newer one is counted or
    after the batch left `validating`."""

    def guard(s: Session, batch_id: str) -> bool:
        stmt = update(Batch).where(
            Batch.id == batch_id, Batch.status == BatchStatus.validating.value, Batch.ingest_attempts == attempt
        )
        return rows_updated(s, stmt.values(ingest_attempts=attempt)) == 1

    return guard


def _abandoned(s: Session, batch_id: str) -> bool:
    """True once the batch left `validating` without starting: its item rows are a stopped attempt's, never
    anyone's requests (a batch out of `validating` never starts)."""
    stmt = select(Batch.id).where(
        Batch.id == batch_id, Batch.status != BatchStatus.validating.value, Batch.in_progress_at.is_(None)
    )
    return s.scalar(stmt) is not None


def _clear_items(rt: Runtime, batch_id: str, guard: t.Callable[[Session, str], bool]) -> bool:
    """Delete the batch's item rows, ``CHUNK_ROWS`` a transaction, while ``guard`` holds; False if it stopped."""
    chunk = select(Item.id).where(Item.batch_id == batch_id).limit(CHUNK_ROWS).scalar_subquery()
    while True:
        with rt.store.transaction() as s:
            if not guard(s, batch_id):
                return False
            deleted = rows_updated(
                s, delete(Item).where(Item.id.in_(chunk)).execution_options(synchronize_session=False)
            )
        if deleted < CHUNK_ROWS:
            return True


class _Inserter:
    """Item rows inserted as the second pass hands them over: each chunk in its own short transaction, held by
    ``_holds`` (the rows stay invisible to claims: the batch is `validating` until they are all in)."""

    def __init__(
        self, rt: Runtime, batch_id: str, attempt: int, ranks: array.array, phase_of: t.Callable[[ParsedLine], Phase]
    ):
        self.rt, self.batch_id, self.ranks, self.phase_of = rt, batch_id, ranks, phase_of
        self.holds = _holds(attempt)
        self.rows: list[dict[str, t.Any]] = []
        self.bytes = 0

    def add(self, p: ParsedLine) -> None:
        self.rows.append(
            {
                "batch_id": self.batch_id,
                "line": p.line,
                "ordinal": self.ranks[p.line],
                "custom_id": p.custom_id,
                "url": p.url,
                "body": p.body,
                "phase": self.phase_of(p).value,
            }
        )
        self.bytes += len(p.body)
        if len(self.rows) >= CHUNK_ROWS or self.bytes >= CHUNK_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            with self.rt.store.transaction() as s:
                if not self.holds(s, self.batch_id):
                    raise _Stopped(self.batch_id)
                s.execute(insert(Item), self.rows)
        self.rows, self.bytes = [], 0


def ingest_batch(rt: Runtime, batch_id: str, max_running: int | None = None) -> bool:
    """Validate the batch's file; then either fail the batch with its line errors, or insert its items and queue them.

    False when the batch must wait its turn, having done nothing: its tenant already runs ``max_running`` attempts
    (the ops worker's ``TIDAL_INGESTS_PER_TENANT``; None, for the API's inline ingest of a small file: no limit).
    Raises on a failure that is not the file's (SQL, storage): the caller retries (the task) or reconcile does.
    """
    begun = _begin_attempt(rt, batch_id, max_running)
    if begun == WAIT:
        return False
    if isinstance(begun, _Attempt):
        _ingest(rt, batch_id, begun)
        send_next(rt, begun.tenant, batch_id)
    return True


def _ingest(rt: Runtime, batch_id: str, begun: _Attempt) -> None:
    """One counted attempt of ``ingest_batch``."""
    endpoint, blob = begun.endpoint, begun.blob
    keys: list[tuple[str, int]] = []
    try:
        if blob is None:
            raise BlobNotFound(batch_id)
        with rt.blobs.open(blob) as f:
            first = validate_file(f, endpoint, rt.settings, lambda p: keys.append(claim_key(p)))
    except BlobNotFound:
        errors = [
            LineError("file_not_found", None, "The input file was deleted before it was validated.", "input_file_id")
        ]
        model = None
    else:
        errors, model = first.errors, first.model

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

    assert blob is not None  # a missing file is an error above
    ranks = _ranks(keys)
    keys.clear()  # the prefixes: up to 512 characters a request
    assert model is not None  # a file without errors holds at least one request, so a model
    room = _decide(rt, batch_id, begun, model, first, now, start=False)
    if room is not None:
        try:
            phase_of = phase_rule(rt.settings, endpoint, begun.phase_split, begun.expires_at - now, room)
            _insert_items(rt, batch_id, begun, first.accepted, ranks, phase_of)
            started = _decide(rt, batch_id, begun, model, first, now, start=True) is not None
        except _Stopped:
            started = False
        if started:
            enqueue_batch(rt, batch_id)
            return
    _clear_items(rt, batch_id, _abandoned)  # refused or stopped: nothing claimable is left, and no rows kept


def _decide(
    rt: Runtime, batch_id: str, begun: _Attempt, model: str, first: Validation, now: int, start: bool
) -> bool | None:
    """The quota verdict, in one short transaction holding the tenant (``lock_tenant``): a batch over it fails
    with ``token_limit_exceeded``. Asked twice: before the items are inserted (``start`` False: a batch over it
    costs no inserts) and once they all are (``start``: the batch moves to `in_progress`, its tokens taken, in the
    same transaction as the verdict, so racing batches never take more than the quota).

    None when the batch failed or is no longer this attempt's; else whether the tenant has room under its
    stored-bytes limit (the phase split freezes no KV for a tenant without).
    """
    with rt.store.transaction() as s:
        lock_tenant(s, begun.tenant)
        if over := token_limit_message(s, rt.settings, begun.tenant, model, first.tokens):
            _claim(s, batch_id, status=BatchStatus.failed.value, failed_at=now, model=model, errors=[token_error(over)])
            return None
        # No rate yet, so the drain counts 0 (policy.laxity): the batch's laxity is its whole window.
        stored, limit = storage_use(s, rt.settings, begun.tenant)
        room = stored < limit
        if not start:
            return room
        started = rows_updated(
            s,
            update(Batch)
            .where(
                Batch.id == batch_id,
                Batch.status == BatchStatus.validating.value,
                Batch.ingest_attempts == begun.attempt,  # a newer attempt owns the item rows now
            )
            .values(
                status=BatchStatus.in_progress.value,
                in_progress_at=now,
                model=model,
                total=first.accepted,
                enqueued_tokens=first.tokens,
            ),
        )
        return room if started else None


def _insert_items(
    rt: Runtime,
    batch_id: str,
    begun: _Attempt,
    accepted: int,
    ranks: array.array,
    phase_of: t.Callable[[ParsedLine], Phase],
) -> None:
    """The second pass: the file's requests become item rows of the still `validating` batch, in chunks of short
    transactions, so no write lock is held for the whole pass (SQLite has one for the whole database). Raises
    ``_Stopped`` once the attempt no longer owns the batch."""
    assert begun.blob is not None
    if begun.attempt > 1 and not _clear_items(rt, batch_id, _holds(begun.attempt)):  # a dead attempt's rows
        raise _Stopped(batch_id)
    inserter = _Inserter(rt, batch_id, begun.attempt, ranks, phase_of)
    with rt.blobs.open(begun.blob) as f:
        second = validate_file(f, begun.endpoint, rt.settings, inserter.add)
    inserter.flush()
    if second.errors or second.accepted != accepted:  # blobs never change: this is storage going wrong
        raise RuntimeError(f"batch {batch_id}: the input file read differently the second time")


def after_failed_attempt(rt: Runtime, batch_id: str, exc: BaseException) -> float | None:
    """An ingest attempt raised ``exc``: the delay before the next attempt, or None after the last (batch failed)."""
    with rt.store.transaction() as s:
        row = s.execute(
            select(Batch.ingest_attempts, Batch.tenant_id).where(
                Batch.id == batch_id, Batch.status == BatchStatus.validating.value
            )
        ).one_or_none()
        if row is None:
            return None
        attempts, tenant = row
        # The attempt is over: the next message may start one at once.
        s.execute(
            update(Batch).where(Batch.id == batch_id, Batch.ingest_attempts == attempts).values(ingest_started_at=None)
        )
    send_next(rt, tenant, batch_id)
    if attempts < rt.settings.ingest_attempts:
        log.warning("batch %s: ingest attempt %d failed (%s); retrying", batch_id, attempts, exc)
        return retry_delay(rt.settings, attempts)
    give_up(rt, batch_id, f"raised {type(exc).__name__}")  # its message (paths, hosts) stays in the log
    return None


def expire_unvalidated(rt: Runtime, now: float) -> list[str]:
    """`validating` batches past expires_at → expired (their ingest never finished); returns their ids.

    They have no items, so there is nothing to finalize: no output file, no error file, as OpenAI's.
    """
    with rt.store.read() as s:
        due = list(
            s.scalars(select(Batch.id).where(Batch.status == BatchStatus.validating.value, Batch.expires_at <= now))
        )
    expired = []
    for batch_id in due:
        with rt.store.transaction() as s:
            if _claim(s, batch_id, status=BatchStatus.expired.value, expired_at=int(now)):
                expired.append(batch_id)
    return expired
