"""Engine outages cost nothing: the node marks its engine down, hands its items back with no retry spent, claims
nothing until /health answers again, then finishes the batch with no error line. On real Redis, SQL and Celery,
with the stub engine scripting the outage (a refused port, 503s with a failing /health)."""

from __future__ import annotations

import threading

import pytest

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import on_node
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import settled
from tidal_engine.serve import free_port
from tidal_workers.execute import execute_item
from tidal_workers.handback import give_back
from tidal_workers.store.models import Item

NODE = "test-node"


@pytest.fixture
def settings(settings):
    """A retry budget of 0: a single failure counted against an item would be an error line."""
    return settings.replace(engine_probe_seconds=0.1, retry_budget=0)


def test_503_with_a_failing_health_is_an_outage_not_a_retry(rt, make_batch, stub):
    batch = make_batch(1)
    stub.health = 503
    stub.script("b0-0", *["503"] * 5)
    (claim,), book, engine = on_node(rt)
    assert execute_item(rt, book, claim.attempt, engine=engine) == "given_back"
    assert stub.seen("b0-0") == 1 and not engine.up and book.paused.is_set()  # one request, no retry: it is down
    assert queued(rt, batch) == 1 and rt.queue.inflight(NODE) == 0  # back in the queue at once
    assert give_back(rt, claim.attempt) == "stale"  # a stale lease gives nothing back twice
    (again,) = rt.queue.claim("node-b", 1, lease_seconds=30, models=("m",))  # another node drains the batch
    assert again.item_id == claim.item_id and again.attempt.number == 2


def test_going_down_hands_back_at_once_what_is_not_at_the_engine(rt, make_batch):
    """As the engine is marked down, claims whose task has not started go back to the queue, and a task waiting for an
    engine token wakes (no token is granted) to hand its own back; marked up, the book grants tokens again."""
    batch = make_batch(3)
    (waiting, unstarted, at_engine), book, engine = on_node(rt, 3)
    book.set_target(1)
    assert book.start(at_engine.attempt)
    assert book.take_token(at_engine.attempt, 1.0)[0]  # sent: the only token
    assert book.start(waiting.attempt)
    woke: list = []
    thread = threading.Thread(target=lambda: woke.append(book.take_token(waiting.attempt, 60.0)))
    thread.start()
    wait_for(lambda: waiting.item_id in book._waiting, 10, "the task to wait for a token")
    engine.mark_down("a refused connection")
    thread.join(10)
    assert woke == [(False, None)]  # at once, not after its 60 s
    assert queued(rt, batch) == 1 and not rt.queue.lease_current(unstarted.attempt)
    assert len(book) == 2  # the unstarted claim left the book; the other two are their tasks' to settle
    assert give_back(rt, waiting.attempt) == "given_back" and queued(rt, batch) == 2  # as it does
    engine.mark_up()
    assert not book.paused.is_set() and rt.queue.lease_current(at_engine.attempt)


def test_a_refused_connection_is_an_outage_without_a_probe(rt, make_batch, stub):
    make_batch(1)
    rt.settings = rt.settings.replace(vllm_url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    (claim,), book, engine = on_node(rt)
    assert execute_item(rt, book, claim.attempt, engine=engine) == "given_back" and not engine.up
    with rt.store.read() as s:  # nothing listened: the engine was gone before the request, no death counted
        assert s.get(Item, claim.item_id).engine_deaths == 0


def test_5xx_while_health_passes_is_the_items_own_error(rt, make_batch, stub):
    rt.settings = rt.settings.replace(retry_budget=1)
    make_batch(1)
    stub.script("b0-0", "503", "503")  # retry_budget 1: two failures are one too many
    (claim,), book, engine = on_node(rt)
    assert execute_item(rt, book, claim.attempt, engine=engine) == "failed"
    assert engine.up and stub.seen("b0-0") == 2 and stub.health_checks == 2


def test_an_outage_longer_than_the_retry_budget_loses_nothing_and_writes_no_error(rt, make_batch, worker, stub):
    """Every request fails while /health fails: all go back, the node stops sending, and finishes once it answers.
    The outage begins once the worker's preflight has passed (an engine down at start is never claimed for), and
    the batch after it, so no item is answered before it."""
    with worker():
        wait_for(lambda: stub.probes >= 1, 30, "the worker's preflight")
        stub.outage = True
        batch = make_batch(8)
        wait_for(
            lambda: len(stub.requests) >= 1 and rt.queue.inflight(rt.settings.node) == 0, 60, "the items to go back"
        )
        sent, probes = len(stub.requests), stub.health_checks
        wait_for(lambda: stub.health_checks >= probes + 5, 60, "the claim loop to probe /health while down")
        assert len(stub.requests) == sent and queued(rt, batch) == 8  # nothing claimed or sent while down
        stub.outage = False
        b, out, err = settled(rt, batch, timeout=60)
    assert (b.completed, b.failed, err) == (8, 0, [])
    assert_exactly_once(rt, batch, out, err)
    with rt.store.read() as s:
        attempts = [s.get(Item, i).attempts for i in item_ids(rt, batch)]
        reclaims = [s.get(Item, i).reclaims for i in item_ids(rt, batch)]
    assert sum(a >= 2 for a in attempts) >= 1  # what was sent during the outage went back: a new attempt, no retry
    assert reclaims == [0] * 8  # handed back by a live worker, never left to expire: no reclaim counted
