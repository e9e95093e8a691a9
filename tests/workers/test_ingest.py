"""Ingest on a real store: items in prefix order, failures recorded, idempotent under redelivery; attempts counted,
retried with backoff, and the batch failed after the last; a `validating` batch expires at its window."""

from __future__ import annotations

import json
import threading
import time

import pytest
from celery.contrib.testing.worker import start_worker
from sqlalchemy import func
from sqlalchemy import select

from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import ops_batch_ids
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import validating_batch
from tidal_workers import ingest
from tidal_workers.cancel import cancel_batch
from tidal_workers.celery_app import make_celery
from tidal_workers.finalize import perform_finalize
from tidal_workers.ingest import after_failed_attempt
from tidal_workers.ingest import ingest_batch
from tidal_workers.ingest import request_ingest
from tidal_workers.ingest import retry_delay
from tidal_workers.quotas import lock_tenant
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import Item
from tidal_workers.sweeps import expire_due
from tidal_workers.sweeps import reconcile
from tidal_workers.task_names import FINALIZE
from tidal_workers.task_names import INGEST
from tidal_workers.task_names import INGEST_QUEUE

CHAT = "/v1/chat/completions"


@pytest.fixture
def settings(settings):
    return settings.replace(models="tiny")


def _line(custom_id: str, model: str = "tiny", content: str = "hi") -> bytes:
    return (
        json.dumps(
            {
                "custom_id": custom_id,
                "method": "POST",
                "url": CHAT,
                "body": {"model": model, "messages": [{"role": "user", "content": content}]},
            }
        ).encode()
        + b"\n"
    )


def _state(rt, batch_id):
    with rt.store.read() as s:
        b = s.get(Batch, batch_id)
        n = s.scalar(select(func.count()).select_from(Item).where(Item.batch_id == batch_id))
    return b, n


def test_redelivery_inserts_nothing_twice(rt):
    batch_id = validating_batch(rt, b"".join(_line(str(i)) for i in range(10)))
    ingest_batch(rt, batch_id)
    ingest_batch(rt, batch_id)  # a redelivered Celery message
    b, n = _state(rt, batch_id)
    assert (b.status, b.total, b.model, n) == ("in_progress", 10, "tiny", 10)
    assert queued(rt, batch_id) == 10  # handed to enqueue_batch once, queued once


def test_model_not_in_the_configured_list_fails_the_batch(rt):
    batch_id = validating_batch(rt, _line("1") + _line("2", model="gpt-9"))
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, n) == ("failed", 0) and b.failed_at is not None
    assert b.errors == [
        {
            "code": "model_not_found",
            "line": 2,
            "param": "body.model",
            "message": "The provided model 'gpt-9' is not supported by the Batch API.",
        }
    ]


def test_input_deleted_before_ingest(rt):
    batch_id = validating_batch(rt, _line("1"))
    with rt.store.transaction() as s:
        f = s.get(File, s.get(Batch, batch_id).input_file_id)
        rt.blobs.delete(f.blob)
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, n, b.errors[0]["code"]) == ("failed", 0, "file_not_found")


def test_a_batch_no_longer_validating_is_left_alone(rt):
    batch_id = validating_batch(rt, _line("1"))
    with rt.store.transaction() as s:
        s.get(Batch, batch_id).status = "cancelled"
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, n) == ("cancelled", 0)


def test_fifty_thousand_lines(rt):
    """The largest allowed file goes in as bulk inserts (about 2 s on SQLite or PostgreSQL here)."""
    batch_id = validating_batch(rt, b"".join(_line(f"r{i}", content=f"prompt {i % 7}") for i in range(50_000)))
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, b.total, n) == ("in_progress", 50_000, 50_000) and queued(rt, batch_id) == 50_000
    with rt.store.read() as s:
        ordinals = s.scalars(select(Item.ordinal).where(Item.batch_id == batch_id).order_by(Item.line).limit(8)).all()
    # grouped by prompt: line 1 ("prompt 0") first, line 8 ("prompt 0" again) right after the other 7142 of its group
    assert ordinals[0] == 0 and ordinals[7] == 1


def _ingest_messages(rt) -> list[str]:
    """Batch ids of the `tidal.ingest` messages waiting in the ops queue (taken out of it)."""
    return ops_batch_ids(rt, INGEST, INGEST_QUEUE)


def _attempted(rt, batch_id, attempts: int, started_at: int) -> None:
    """As if ``attempts`` attempts had begun, the last at ``started_at``, and its process had died."""
    with rt.store.transaction() as s:
        b = s.get(Batch, batch_id)
        b.ingest_attempts, b.ingest_started_at = attempts, started_at


def test_reconcile_resends_a_dead_attempt_with_backoff_and_fails_the_batch_after_the_last(rt):
    resend = rt.settings.ingest_resend_seconds
    assert rt.settings.ingest_attempts == 3
    batch_id = validating_batch(rt, _line("1"))
    created = batch_row(rt, batch_id).created_at
    reconcile(rt, now=created + resend - 1)
    assert _ingest_messages(rt) == []  # the API's own message may still be on its way
    reconcile(rt, now=created + resend)
    assert _ingest_messages(rt) == [batch_id]

    _attempted(rt, batch_id, 1, int(time.time()))
    ingest_batch(rt, batch_id)  # a duplicate message while attempt 1 runs: it does nothing, and counts nothing
    assert (batch_row(rt, batch_id).status, batch_row(rt, batch_id).ingest_attempts) == ("validating", 1)

    for attempts, due in ((1, resend), (2, 2 * resend)):  # each attempt that dies waits twice as long
        started = created + 1000 * attempts
        _attempted(rt, batch_id, attempts, started)
        reconcile(rt, now=started + due - 1)
        assert _ingest_messages(rt) == [], attempts
        reconcile(rt, now=started + due)
        assert _ingest_messages(rt) == [batch_id], attempts

    _attempted(rt, batch_id, 3, created + 3000)
    ingest_batch(rt, batch_id)  # a late duplicate message: no fourth attempt, and the verdict is reconcile's
    assert (batch_row(rt, batch_id).status, batch_row(rt, batch_id).ingest_attempts) == ("validating", 3)
    reconcile(rt, now=created + 3000 + 4 * resend - 1)
    assert batch_row(rt, batch_id).status == "validating"
    reconcile(rt, now=created + 3000 + 4 * resend)
    b, n = _state(rt, batch_id)
    assert (b.status, n, _ingest_messages(rt)) == ("failed", 0, [])
    assert b.failed_at is not None and b.errors == [
        {
            "code": "ingest_failed",
            "line": None,
            "param": None,
            "message": "The input file could not be validated: 3 attempts failed; the last stopped before it "
            "finished (its process died: killed, or out of memory).",
        }
    ]


def test_an_attempt_that_raises_is_retried_with_backoff_until_the_batch_fails(rt, settings):
    """The ops worker's task retries an error that is not the file's (here the storage answers a directory)."""
    rt.settings = settings.replace(ingest_backoff_seconds=0.05)
    batch_id = validating_batch(rt, _line("1"))
    with rt.store.read() as s:
        blob = s.get(File, s.get(Batch, batch_id).input_file_id).blob
    rt.blobs.delete(blob)
    (rt.settings.blob_path / blob).mkdir()  # open() raises IsADirectoryError: not a missing file, a broken store
    with pytest.raises(IsADirectoryError):
        ingest_batch(rt, batch_id)
    assert after_failed_attempt(rt, batch_id, IsADirectoryError()) == 0.05
    assert retry_delay(rt.settings, 2) == 0.1 and retry_delay(rt.settings, 3) == 0.2

    app = make_celery(rt.settings, "ingest")  # the ops worker's ingest part; given no queue, it takes both
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING"):
        request_ingest(rt, batch_id)  # attempt 2, then 3 after its backoff, then the verdict
        wait_for(lambda: batch_row(rt, batch_id).status == "failed", 30, "the batch to fail")
    b = batch_row(rt, batch_id)
    assert b.ingest_attempts == 3 and [e["code"] for e in b.errors] == ["ingest_failed"]
    # the exception's type, not its message: that names a path of the storage, which the log keeps
    assert (
        b.errors[0]["message"]
        == "The input file could not be validated: 3 attempts failed; the last raised IsADirectoryError."
    )


def test_a_validating_batch_expires_at_its_window(rt):
    batch_id = validating_batch(rt, _line("1"))
    expires_at = batch_row(rt, batch_id).expires_at
    assert expire_due(rt, now=expires_at - 1) == []
    assert expire_due(rt, now=expires_at) == [batch_id]
    ingest_batch(rt, batch_id)  # its ingest, arriving late, finds nothing to do
    b, n = _state(rt, batch_id)
    assert (b.status, b.expired_at, n, b.output_file_id, b.error_file_id) == ("expired", expires_at, 0, None, None)
    assert expire_due(rt, now=expires_at + 60) == []


class _PausedInput:
    """The input file as the ingest reads it, stopping before line ``after + 1`` until ``resume`` is set."""

    def __init__(self, f, after: int, reached: threading.Event, resume: threading.Event):
        self.f, self.after, self.reached, self.resume, self.lines = f, after, reached, resume, 0

    def readline(self, limit: int = -1) -> bytes:
        self.lines += 1
        if self.lines == self.after + 1:
            self.reached.set()
            assert self.resume.wait(60), "the test never resumed the read"
        return self.f.readline(limit)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


@pytest.fixture
def paused_second_pass(rt, monkeypatch):
    """Ingest in chunks of 2 rows whose second pass stops after 5 lines: (reached, resume) events."""
    monkeypatch.setattr(ingest, "CHUNK_ROWS", 2)
    reached, resume = threading.Event(), threading.Event()
    opened = []
    real_open = rt.blobs.open

    def open_blob(name):
        opened.append(name)
        f = real_open(name)
        return _PausedInput(f, 5, reached, resume) if len(opened) == 2 else f

    monkeypatch.setattr(rt.blobs, "open", open_blob)
    yield reached, resume
    resume.set()


def _in_thread(fn, *args) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


def test_a_writer_is_not_held_up_by_an_ingests_second_pass(rt, paused_second_pass):
    """The second pass inserts in short transactions: another create's quota transaction (the tenant's row, and on
    SQLite the only write lock) commits while the pass waits on its input, and the rows are not claimable yet."""
    reached, resume = paused_second_pass
    batch_id = validating_batch(rt, b"".join(_line(str(i)) for i in range(10)))
    ingesting = _in_thread(ingest_batch, rt, batch_id)
    assert reached.wait(30), "the ingest never reached its second pass"
    committed = threading.Event()

    def create() -> None:
        with rt.store.transaction() as s:
            lock_tenant(s, "acme")  # what POST /v1/batches takes to decide the tenant's quotas
        committed.set()

    writer = _in_thread(create)
    mid_pass = committed.wait(5)
    b, n = _state(rt, batch_id)
    claimable = queued(rt, batch_id)
    resume.set()
    ingesting.join(60)
    writer.join(60)
    assert mid_pass, "the write waited for the ingest's second pass"
    assert (b.status, n, claimable) == ("validating", 4, 0)  # two chunks in, none claimable
    b, n = _state(rt, batch_id)
    assert (b.status, b.total, n, queued(rt, batch_id)) == ("in_progress", 10, 10, 10)


def test_a_batch_cancelled_mid_ingest_keeps_no_rows_and_no_files(rt, paused_second_pass):
    reached, resume = paused_second_pass
    batch_id = validating_batch(rt, b"".join(_line(str(i)) for i in range(10)))
    ingesting = _in_thread(ingest_batch, rt, batch_id)
    assert reached.wait(30), "the ingest never reached its second pass"
    cancel_batch(rt, batch_id)
    assert ops_batch_ids(rt, FINALIZE) == [batch_id]  # the cancel asks for the finalize; the ops worker runs it
    assert perform_finalize(rt, batch_id)
    resume.set()
    ingesting.join(60)
    b, n = _state(rt, batch_id)
    assert (b.status, b.total, n, b.output_file_id, b.error_file_id) == ("cancelled", 0, 0, None, None)


def test_a_newer_attempt_owns_the_rows_of_an_attempt_presumed_dead(rt, paused_second_pass):
    """An attempt resent while the first still runs (it looked dead) clears the first's rows; the first stops at
    its next chunk, so each request is one row."""
    reached, resume = paused_second_pass
    batch_id = validating_batch(rt, b"".join(_line(str(i)) for i in range(10)))
    first = _in_thread(ingest_batch, rt, batch_id)
    assert reached.wait(30), "the ingest never reached its second pass"
    _attempted(rt, batch_id, 1, int(time.time()) - 10 * rt.settings.ingest_resend_seconds)
    ingest_batch(rt, batch_id)  # the third open is the real file: this attempt runs through
    resume.set()
    first.join(60)
    b, n = _state(rt, batch_id)
    assert (b.status, b.total, b.ingest_attempts, n, queued(rt, batch_id)) == ("in_progress", 10, 2, 10, 10)
