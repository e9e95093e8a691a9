"""The SLA floor: a tenant's urgent batches are admitted at floor_rate per node past a closed gate, within the floor's
share of the pool, on real Redis and SQL."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
from prometheus_client import REGISTRY

from tests.support.stub_engine import metrics_text
from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import settled
from tidal_workers.claim import URGENT_READ_SECONDS
from tidal_workers.claim import ClaimLoop
from tidal_workers.context import WorkerContext
from tidal_workers.gate import FixedGate
from tidal_workers.leases import LeaseBook
from tidal_workers.rescore import rescore

FLOOR_RATE = 4.0


@pytest.fixture
def settings(settings):
    """The real AIMD gate, starting closed; a floor fast enough to measure in seconds."""
    return settings.replace(
        gate_mode="aimd", initial_inflight=0, floor_rate=FLOOR_RATE, scrape_seconds=0.5, dispatch_prefetch=0
    )


def loop_for(rt, target: int, sent: list, settle: bool):
    book = LeaseBook()

    def send(claims):
        sent.extend(claims)
        for c in claims if settle else ():  # an engine that answers at once: the slot is free again
            rt.queue.complete(c.attempt)
            book.discard(c.attempt)
        return claims

    return ClaimLoop(WorkerContext(rt, book), FixedGate(target), send)


def urgent_pair(rt, make_batch, n: int = 100):
    """An urgent batch (ten minutes left) and a calm one (a day left)."""
    calm = make_batch(n)
    urgent = make_batch(n, expires_in=600)
    rescore(rt)  # ten minutes of slack against a 6 h horizon: urgency 0.97
    assert rt.queue.urgent() == {urgent} and batch_row(rt, urgent).priority < 10
    return calm, urgent


def test_a_closed_gate_still_admits_an_urgent_batch_at_the_floor_rate(rt, make_batch):
    calm, urgent = urgent_pair(rt, make_batch)
    sent: list = []
    loop = loop_for(rt, 0, sent, settle=True)
    t0 = time.time()
    for k in range(201):  # ten simulated seconds, a pass every 50 ms
        loop.tick(t0 + 0.05 * k)
    assert {c.batch_id for c in sent} == {urgent}  # nothing else passes the closed gate
    assert len(sent) == 1 + FLOOR_RATE * 10  # a full bucket of one, then the rate
    assert [c.item_id for c in sent] == item_ids(rt, urgent)[: len(sent)]  # still in prefix order
    assert queued(rt, calm) == 100


def test_a_floor_rate_of_0_turns_the_floor_off(rt, make_batch):
    urgent_pair(rt, make_batch)
    rt.settings = rt.settings.replace(floor_rate=0.0)
    sent: list = []
    loop = loop_for(rt, 0, sent, settle=True)
    t0 = time.time()
    assert sum(loop.tick(t0 + k) for k in range(5)) == 0 and sent == []


def test_floor_items_count_as_in_flight(rt, make_batch):
    _calm, urgent = urgent_pair(rt, make_batch)
    sent: list = []
    loop = loop_for(rt, 3, sent, settle=False)
    t0 = time.time()
    assert loop.tick(t0) == 3 and rt.queue.inflight(rt.settings.node) == 3
    assert [c.batch_id for c in sent] == [urgent] * 3  # the floor's one, then the gate's remaining two
    assert loop.tick(t0 + 0.1) == 0  # the gate is full and the bucket empty
    rt.queue.set_urgent([])
    assert loop.tick(t0 + 10) == 0 and loop.buckets == {}  # no longer urgent: no floor, and the gate is full


def test_the_claim_loop_reads_the_urgent_batches_at_most_once_a_second(rt, make_batch):
    """A pass runs after every release; the set changes only with the re-score, every few seconds."""
    _calm, urgent = urgent_pair(rt, make_batch)
    loop = loop_for(rt, 0, [], settle=True)
    t0 = time.time()
    loop.tick(t0)
    assert loop.urgent == {"acme": [urgent]} and set(loop.buckets) == {"acme"}
    rt.queue.set_urgent([])
    loop.tick(t0 + URGENT_READ_SECONDS / 2)
    assert set(loop.buckets) == {"acme"}  # the reading of a second ago still serves
    loop.tick(t0 + URGENT_READ_SECONDS)
    assert loop.buckets == {}


def test_a_tenant_with_many_urgent_batches_gets_one_floor(rt, make_batch):
    """Issue 37, M2: the floor was one bucket per urgent batch, so a tenant that split its work into many batches
    had as many floors. One bucket per tenant now, spent on its earliest-deadline urgent batch."""
    urgent = [make_batch(100, expires_in=600 + i) for i in range(6)]
    rescore(rt)
    assert rt.queue.urgent() == set(urgent)
    sent: list = []
    loop = loop_for(rt, 0, sent, settle=True)
    t0 = time.time()
    for k in range(201):  # ten simulated seconds, a pass every 50 ms
        loop.tick(t0 + 0.05 * k)
    assert len(sent) == 1 + FLOOR_RATE * 10  # one tenant's floor, not six
    assert {c.batch_id for c in sent} == {urgent[0]}


def test_the_floor_holds_at_most_its_share_of_the_pool_and_tenants_take_turns(rt, make_batch, settings):
    """Issue 37, M2: however many urgent batches and tenants, the floor holds at most TIDAL_FLOOR_SHARE of the pool
    past the gate (here half of 4 threads), and the tenants share that room."""
    rt.settings = settings.replace(floor_share=0.5)
    acme = [make_batch(20, expires_in=600 + i) for i in range(3)]
    globex = make_batch(20, tenant="globex", expires_in=600)
    rescore(rt)
    assert rt.queue.urgent() == {*acme, globex}
    sent: list = []
    loop = loop_for(rt, 0, sent, settle=False)  # the engine never answers: what the floor admits stays held
    t0 = time.time()
    for k in range(201):
        loop.tick(t0 + 0.05 * k)
        assert loop.leases.floor_held() <= 2
    assert Counter(c.batch_id for c in sent) == {acme[0]: 1, globex: 1}
    first = sent[0]
    rt.queue.complete(first.attempt)
    loop.leases.discard(first.attempt)  # one answered: room for one more
    loop.tick(t0 + 11)
    assert len(sent) == 3 and loop.leases.floor_held() == 2


def test_a_batch_starved_by_online_load_still_makes_its_floor_rate(rt, make_batch, stub, worker):
    stub.metrics = metrics_text(kv_usage=0.99, running=8)  # online load fills the KV cache: the real gate stays shut
    n = 12
    calm, urgent = urgent_pair(rt, make_batch, n)
    seen_at: list[float] = []

    def arrivals_until_done() -> bool:
        """Stamp each request the stub has received since the last look; whether the urgent batch is done."""
        seen_at.extend([time.monotonic()] * (len(stub.requests) - len(seen_at)))
        return batch_row(rt, urgent).status != "in_progress"

    with worker():
        wait_for(arrivals_until_done, 90, "the urgent batch to leave in_progress", every=0.02)
        _b, out, err = settled(rt, urgent)
        assert REGISTRY.get_sample_value("tidal_gate_target") == 0  # the gate never opened
    assert len(out) == n and not err
    assert batch_row(rt, calm).completed == 0 and queued(rt, calm) == n  # the gate admitted nothing
    rate = (n - 2) / (seen_at[-1] - seen_at[1])  # from the second arrival: the first may wait on a cold worker
    # settles at the floor, not above it
    assert FLOOR_RATE / 4 <= rate <= FLOOR_RATE * 1.5, f"{rate:.2f} items/s (load average {os.getloadavg()})"


def test_the_floor_claims_nothing_while_the_engine_is_down(rt, make_batch, stub):
    """The floor admits urgent work past a closed gate, never past a dead engine; it resumes once /health answers."""
    _calm, urgent = urgent_pair(rt, make_batch)
    rt.settings = rt.settings.replace(engine_probe_seconds=1.0)
    sent: list = []
    loop = loop_for(rt, 0, sent, settle=True)
    loop.engine.mark_down("a refused connection")  # what a task finds first
    assert loop.leases.paused.is_set()  # no engine token either
    stub.outage = True
    t0 = time.time()
    for k in range(201):  # ten simulated seconds, a pass every 50 ms: the bucket fills, the engine stays down
        loop.tick(t0 + 0.05 * k)
    assert sent == [] and rt.queue.inflight(rt.settings.node) == 0
    assert stub.health_checks == 11  # once per probe period (at 0, 1, ..., 10 s), no more
    stub.outage = False
    assert loop.tick(t0 + 11) == 1 and loop.engine.up  # the next probe finds it up: a full bucket of one
    assert {c.batch_id for c in sent} == {urgent} and not loop.leases.paused.is_set()
