"""Fencing, cancel and expiry: every custom_id ends in exactly one line, whatever races."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy import update

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import booked
from tests.support.worker_helpers import ops_batch_ids
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import wait_lease_expired
from tidal_workers.cancel import cancel_batch
from tidal_workers.claim import ClaimLoop
from tidal_workers.context import WorkerContext
from tidal_workers.execute import execute_item
from tidal_workers.finalize import perform_finalize
from tidal_workers.gate import FixedGate
from tidal_workers.leases import LeaseBook
from tidal_workers.reclaim import reclaim
from tidal_workers.result import Entry
from tidal_workers.result import Outcome
from tidal_workers.result import record
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus
from tidal_workers.sweeps import reconcile
from tidal_workers.task_names import FINALIZE

NODE = "test-node"


def test_stale_attempt_is_dropped_and_first_write_wins(rt, make_batch, stub):
    batch = make_batch(1)
    (old,) = rt.queue.claim(NODE, 1, 0.2, ["m"])
    wait_lease_expired(rt, old.item_id)
    reclaim(rt)  # the first worker "died": its lease expired
    (new,) = rt.queue.claim("node-b", 1, 30, ["m"])
    assert new.item_id == old.item_id and new.attempt.number == 2

    assert execute_item(rt, booked(old), old.attempt) == "stale" and stub.requests == []
    late = Outcome(status=ItemStatus.completed, response_status=200, request_id="late", body='{"late": true}')
    assert not record(rt, Entry(old.attempt, batch, late))  # a zombie's late result never lands

    assert execute_item(rt, booked(new), new.attempt) == "completed"
    assert not record(rt, Entry(new.attempt, batch, late))  # a second write of the same attempt neither
    assert perform_finalize(rt, batch)  # what the ops worker does on the item task's finalize request
    b, out, err = settled(rt, batch)
    assert (b.completed, b.failed, err) == (1, 0, [])
    assert out[0]["response"]["request_id"] != "late"
    with rt.store.read() as s:
        assert s.get(Item, new.item_id).attempts == 2


def test_the_book_vouches_for_a_lease_only_until_half_of_it_has_passed(rt, make_batch, stub, settings):
    """The claim loop trusts each lease for half a lease from when its claim was sent, so the re-checks before
    the POST and the result write skip Redis; a node stalled past that (its lease expired and was reclaimed)
    asks Redis again: its stale attempt is neither sent nor recorded."""
    make_batch(2)
    book, sent = LeaseBook(), []

    def claim_one(lease_seconds: float):
        rt.settings = settings.replace(lease_seconds=lease_seconds, dispatch_prefetch=0)
        ClaimLoop(WorkerContext(rt, book), FixedGate(1), lambda claims: sent.extend(claims) or claims).tick(time.time())
        return sent[-1]

    before = time.monotonic()
    trusted = claim_one(60.0)
    assert before + 30 <= book._held[trusted.item_id].trusted_until <= time.monotonic() + 30
    assert book.current(trusted.attempt)
    assert rt.queue.complete(trusted.attempt)
    book.discard(trusted.attempt)

    stalled = claim_one(0.2)  # trusted for 0.1 s
    wait_lease_expired(rt, stalled.item_id)
    reclaim(rt)
    (again,) = rt.queue.claim("node-b", 1, 30, ["m"])
    assert again.item_id == stalled.item_id
    assert not book.current(stalled.attempt)
    assert execute_item(rt, book, stalled.attempt) == "stale" and stub.requests == []


def test_cancel_with_nothing_in_flight_asks_the_ops_worker_which_closes_it_at_once(rt, make_batch):
    """The cancel (the HTTP request's work) writes no file: it asks for the finalize, which the ops worker performs."""
    batch = make_batch(3)
    cancel_batch(rt, batch)
    assert batch_row(rt, batch).status == "cancelling" and ops_batch_ids(rt, FINALIZE) == [batch]
    assert perform_finalize(rt, batch)  # the ops worker's task for that request
    b, out, err = settled(rt, batch, ("cancelled",))
    assert b.cancelling_at and b.cancelled_at and out == [] and b.output_file_id is None
    assert [line["error"]["code"] for line in err] == ["batch_cancelled"] * 3
    assert all(line["response"] is None for line in err)
    assert queued(rt, batch) == 0 and rt.queue.queued_batches() == []
    cancel_batch(rt, batch)  # cancelling twice changes nothing
    assert batch_row(rt, batch).cancelled_at == b.cancelled_at


def test_cancel_mid_batch_keeps_what_finished_and_cancels_the_rest(rt, make_batch, worker, stub):
    stub.delay = 0.3
    batch = make_batch(20)
    with worker():
        wait_for(lambda: batch_row(rt, batch).completed >= 2, what="two items to finish")
        sent_at_cancel = len(stub.requests)
        cancel_batch(rt, batch)
        assert batch_row(rt, batch).status in ("cancelling", "cancelled")
        b, out, err = settled(rt, batch, ("cancelled",))
    assert_exactly_once(rt, batch, out, err)
    assert len(out) == b.completed >= 2
    assert {line["error"]["code"] for line in err} == {"batch_cancelled"}
    assert len(stub.requests) <= sent_at_cancel + rt.settings.max_inflight  # no new claims after the cancel


def test_racing_finalizers_elect_exactly_one(rt, make_batch):
    batch = make_batch(3, enqueue=False)
    with rt.store.transaction() as s:  # every item done, as if the last worker died before finalizing
        s.execute(
            update(Item)
            .where(Item.batch_id == batch)
            .values(status=ItemStatus.completed.value, response_status=200, request_id="r", response_body="{}")
        )
        s.execute(update(Batch).where(Batch.id == batch).values(completed=3))
    with ThreadPoolExecutor(4) as pool:
        won = list(pool.map(lambda _: perform_finalize(rt, batch), range(4)))
    assert won.count(True) == 1
    _b, out, err = settled(rt, batch)
    assert len(out) == 3 and err == []
    with rt.store.read() as s:
        assert s.scalar(select(func.count()).select_from(File).where(File.purpose == "batch_output")) == 1


def test_reconcile_finishes_what_a_dead_finalizer_left(rt, make_batch, settings):
    done, stuck, cancelling = make_batch(1), make_batch(1), make_batch(2)
    with rt.store.transaction() as s:
        s.execute(
            update(Item)
            .where(Item.batch_id.in_([done, stuck]))
            .values(status=ItemStatus.completed.value, response_status=200, request_id="r", response_body="{}")
        )
        s.execute(update(Batch).where(Batch.id == done).values(completed=1))
        s.execute(
            update(Batch)
            .where(Batch.id == stuck)
            .values(completed=1, status="finalizing", finalizing_at=int(time.time() - 2 * settings.reconcile_seconds))
        )
        s.execute(update(Batch).where(Batch.id == cancelling).values(status="cancelling"))
    rt.redis.flushdb()  # and Redis lost everything meanwhile

    assert reconcile(rt) == 0  # nothing is in progress with pending items
    assert batch_row(rt, done).status == "completed" and batch_row(rt, stuck).status == "completed"
    _b, _out, err = settled(rt, cancelling, ("cancelled",))
    assert [line["error"]["code"] for line in err] == ["batch_cancelled"] * 2


def test_priority_sent_is_the_batch_priority_at_submission(rt, make_batch, stub):
    batch = make_batch(1, priority=100)
    (claim,) = rt.queue.claim(NODE, 1, 30, ["m"])
    with rt.store.transaction() as s:  # escalated after the claim, before the POST
        s.execute(update(Batch).where(Batch.id == batch).values(priority=3))
    assert execute_item(rt, booked(claim), claim.attempt) == "completed"
    assert [body["priority"] for body in stub.requests] == [3]
