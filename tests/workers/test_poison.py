"""Poison items (issue 37, item 2; review H3): a line whose request kills the engine is not an outage for ever. Each
engine death counts against the item at the engine, in SQL, so the count survives a worker's restart; at
TIDAL_ENGINE_CRASH_LIMIT the item is an `engine_crash` error line and `tidal_engine_crash_items_total` counts it.
On real Redis, SQL and Celery, with the stub engine dying (connection dropped, /health failing, back shortly) on one
marked prompt."""

from __future__ import annotations

import prometheus_client
import pytest

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import settled
from tidal_workers.store.models import Item


def crash_items() -> float:
    return prometheus_client.REGISTRY.get_sample_value("tidal_engine_crash_items_total") or 0.0


@pytest.fixture
def settings(settings):
    """One item on the node at a time (none prefetched), so only the marked one is at the engine when it dies and
    none is sent between its death and the node marking it down; no retries."""
    return settings.replace(
        engine_probe_seconds=0.1, retry_budget=0, max_inflight=1, dispatch_prefetch=0, engine_crash_limit=2
    )


def deaths(rt, batch: str) -> dict[str, int]:
    with rt.store.read() as s:
        return {s.get(Item, i).custom_id: s.get(Item, i).engine_deaths for i in item_ids(rt, batch)}


def test_a_line_that_kills_the_engine_becomes_an_error_line_after_the_limit(rt, make_batch, worker, stub):
    batch = make_batch(4)
    stub.deadly, stub.restart_seconds = {"b0-2"}, 3.0  # down until this worker has stopped
    alerts = crash_items()
    with worker():
        wait_for(lambda: deaths(rt, batch)["b0-2"] == 1, 30, "the first engine death to be counted")
    stub.restart_seconds = 0.3
    # A new worker (another process, as after a restart) goes on from the count SQL holds.
    assert stub.deaths == 1 and crash_items() == alerts
    with worker():
        b, out, err = settled(rt, batch, timeout=60)
    assert (b.completed, b.failed) == (3, 1) and stub.deaths == 2  # the limit: no third death
    (line,) = err
    assert line["custom_id"] == "b0-2" and line["error"]["code"] == "engine_crash"
    assert "died 2 times" in line["error"]["message"]
    assert deaths(rt, batch) == {"b0-0": 0, "b0-1": 0, "b0-2": 2, "b0-3": 0}
    assert crash_items() == alerts + 1
    assert_exactly_once(rt, batch, out, err)
