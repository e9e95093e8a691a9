"""Engine outages cost nothing: the node marks its engine down, hands its items back with no retry spent, claims
nothing until /health answers again, then finishes the batch with no error line. On real Redis, SQL and Celery,
with the stub engine scripting the outage (a refused port, 503s with a failing /health)."""

from __future__ import annotations

import pytest
from workers.worker_helpers import assert_exactly_once
from workers.worker_helpers import booked
from workers.worker_helpers import item_ids
from workers.worker_helpers import queued
from workers.worker_helpers import settled
from workers.worker_helpers import wait_for

from tidal_engine.serve import free_port
from tidal_workers.engine_health import EngineHealth
from tidal_workers.execute import execute_item
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
    (claim,) = rt.queue.claim(NODE, 1, lease_seconds=30, models=("m",))
    engine = EngineHealth(rt.settings)
    assert execute_item(rt, booked(claim), claim.item_id, claim.lease, engine=engine) == "given_back"
    assert stub.seen("b0-0") == 1 and not engine.up  # one request, no retry: the engine is down
    assert queued(rt, batch) == 1 and rt.queue.inflight(NODE) == 0  # back in the queue at once
    assert not rt.queue.lease_current(claim.item_id, claim.lease)


def test_a_refused_connection_is_an_outage_without_a_probe(rt, make_batch, stub):
    make_batch(1)
    rt.settings = rt.settings.replace(vllm_url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    (claim,) = rt.queue.claim(NODE, 1, lease_seconds=30, models=("m",))
    engine = EngineHealth(rt.settings)
    assert execute_item(rt, booked(claim), claim.item_id, claim.lease, engine=engine) == "given_back"
    assert not engine.up


def test_5xx_while_health_passes_is_the_items_own_error(rt, make_batch, stub):
    rt.settings = rt.settings.replace(retry_budget=1)
    make_batch(1)
    stub.script("b0-0", "503", "503")  # retry_budget 1: two failures are one too many
    (claim,) = rt.queue.claim(NODE, 1, lease_seconds=30, models=("m",))
    engine = EngineHealth(rt.settings)
    assert execute_item(rt, booked(claim), claim.item_id, claim.lease, engine=engine) == "failed"
    assert engine.up and stub.seen("b0-0") == 2 and stub.health_checks == 2


def test_an_outage_longer_than_the_retry_budget_loses_nothing_and_writes_no_error(rt, make_batch, worker, stub):
    """Every request fails while /health fails: all go back, the node stops sending, and finishes once it answers."""
    batch = make_batch(8)
    stub.outage = True
    with worker():
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
    assert sum(a >= 2 for a in attempts) >= 1  # what was sent during the outage went back: a new attempt, no retry
