"""Placement across replicas emerges from the gates: two `tidal worker`s on two nodes claim from one queue, each
gated by its own engine's /metrics, and the batch goes to whichever node is idle."""

from __future__ import annotations

import signal

import pytest
from sqlalchemy import select

from tests.support.stub_engine import StubEngine
from tests.support.stub_engine import metrics_text
from tests.support.wait import wait_for
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import spawn_fleet
from tidal_workers.store.models import Item

BUSY = metrics_text(kv_usage=0.95)  # above kv_high: the gate halves, down to 0
IDLE = metrics_text(kv_usage=0.1)  # below kv_low: the gate grows while in use


@pytest.fixture
def engines():
    pair = [StubEngine(delay=0.02), StubEngine(delay=0.02)]
    yield pair
    for engine in pair:
        engine.close()


def share(rt, batch_id: str, engines) -> list[int]:
    """Items of the batch each engine was sent (the stub identifies a request by its custom_id)."""
    with rt.store.read() as s:
        ids = set(s.scalars(select(Item.custom_id).where(Item.batch_id == batch_id)))
    return [len({r["messages"][0]["content"] for r in e.requests} & ids) for e in engines]


def test_batch_goes_to_the_idle_node_and_follows_the_pressure(rt, settings, make_batch, engines, children, tmp_path):
    # A scrape answers within half a period or fails safe (gate closed): a whole second leaves room for a
    # loaded machine. alpha = 1: each scrape is believed at once, so the flip takes a few periods.
    gated = settings.replace(
        gate_mode="aimd",
        scrape_seconds=1.0,
        ewma_alpha=1.0,
        min_inflight=0,
        initial_inflight=1,
        max_inflight=4,
        worker_threads=4,
        worker_metrics_port=0,
    )
    engines[0].metrics, engines[1].metrics = BUSY, IDLE
    spawn_fleet(gated, {f"node-{i}": engine.url for i, engine in enumerate(engines)}, children, tmp_path)
    wait_for(lambda: all(e.scrapes >= 2 for e in engines), timeout=60, what="both workers' gates to scrape")

    first = make_batch(40)
    b, _, err = settled(rt, first)
    assert (b.completed, err) == (40, [])
    before = share(rt, first, engines)

    engines[0].metrics, engines[1].metrics = IDLE, BUSY
    seen = [e.scrapes for e in engines]
    # node-1 halves once per scrape (4 -> 2 -> 1 -> 0), node-0 grows from 0
    wait_for(lambda: all(e.scrapes >= n + 4 for e, n in zip(engines, seen)), timeout=120, what="the gates to turn")
    second = make_batch(40)
    b, _, err = settled(rt, second)
    assert (b.completed, err) == (40, [])
    after = share(rt, second, engines)

    for p in children:
        p.send_signal(signal.SIGTERM)
    for p in children:
        p.wait(30)
    assert before[1] >= 38 and before[0] <= 2, before
    assert after[0] >= 38 and after[1] <= 2, after
