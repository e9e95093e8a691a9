"""Misconfigured engines cost nothing (issue 37, item 13): a worker whose engine refuses the `priority` Tidal sends
claims nothing, says why in its log, its /ready and `tidal_preflight_ok`, and claims once the engine is fixed; an
item that still meets the refusal goes back to the queue, no retry spent. On real Redis, SQL and Celery, with the
stub engine answering 400 as an engine without priority scheduling that refuses the field."""

from __future__ import annotations

import time

import prometheus_client
import pytest
import requests

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import on_node
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import settled
from tidal_engine.serve import free_port
from tidal_workers.execute import execute_item
from tidal_workers.store.models import Item


def preflight_ok() -> float | None:
    return prometheus_client.REGISTRY.get_sample_value("tidal_preflight_ok")


@pytest.fixture
def settings(settings):
    """A retry budget of 0: a refusal counted against an item would be its error line."""
    return settings.replace(engine_probe_seconds=0.1, retry_budget=0, worker_metrics_port=free_port())


def test_a_priority_refusal_hands_the_item_back_and_fails_the_preflight(rt, make_batch, stub):
    batch = make_batch(1)
    stub.refuse_priority = True
    (claim,), book, engine = on_node(rt)
    assert execute_item(rt, book, claim.attempt, engine=engine) == "given_back"
    assert queued(rt, batch) == 1 and stub.seen("b0-0") == 1  # back in the queue, sent once: no retry
    with rt.store.read() as s:
        item = s.get(Item, claim.item_id)
        assert (item.status, item.attempts, item.error_code) == ("pending", 0, None)
    assert book.paused.is_set() and preflight_ok() == 0  # the node sends nothing more
    assert "--scheduling-policy priority" in engine.verdict().detail
    assert not engine.may_claim(time.time())  # the probe meets the same refusal
    stub.refuse_priority = False
    wait_for(lambda: engine.may_claim(time.time()), 10, "a probe of the fixed engine to pass")
    assert not book.paused.is_set() and preflight_ok() == 1


def test_a_worker_claims_nothing_until_its_engine_takes_priority(rt, make_batch, worker, stub, settings, capfd):
    batch = make_batch(6)
    stub.refuse_priority = True
    ready = f"http://127.0.0.1:{settings.worker_metrics_port}/ready"
    with worker():
        wait_for(lambda: stub.probes >= 3, 30, "the worker to probe its engine")
        assert stub.requests == [] and queued(rt, batch) == 6  # nothing claimed, nothing sent
        answer = requests.get(ready, timeout=10)
        assert answer.status_code == 503 and "--scheduling-policy priority" in answer.json()["checks"]["preflight"]
        assert preflight_ok() == 0
        said = [line for line in capfd.readouterr().err.splitlines() if "fails its preflight" in line]
        assert len(said) == 1 and "--scheduling-policy priority" in said[0]  # one line, however many probes
        stub.refuse_priority = False
        b, out, err = settled(rt, batch, timeout=60)
        # /ready answers from checks up to READY_CACHE_SECONDS old
        wait_for(lambda: requests.get(ready, timeout=10).status_code == 200, 5, "/ready to follow the preflight")
        assert preflight_ok() == 1
    assert (b.completed, b.failed, err) == (6, 0, [])
    assert_exactly_once(rt, batch, out, err)
