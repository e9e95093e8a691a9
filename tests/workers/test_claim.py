"""The claim loop against real Redis and SQL: the gate bounds in-flight items, leases are renewed, data loss rebuilds."""

from __future__ import annotations

import threading
import time

from workers.worker_helpers import queued
from workers.worker_helpers import wait_for

from tidal_workers.claim import ClaimLoop
from tidal_workers.context import LeaseBook
from tidal_workers.context import WorkerContext
from tidal_workers.gate import FixedGate


def loop_for(rt, target: int, sent: list):
    def send(claims):
        sent.extend(claims)
        return claims

    return ClaimLoop(WorkerContext(rt, LeaseBook()), FixedGate(target), send)


def test_claims_up_to_the_gate_target_minus_in_flight(rt, make_batch):
    make_batch(10, enqueue=False)  # the loop's first pass rebuilds the queue from SQL
    sent: list = []
    loop = loop_for(rt, 3, sent)
    now = time.time()
    assert loop.tick(now) == 3 and rt.queue.inflight(rt.settings.node) == 3
    assert loop.tick(now) == 0  # the gate is full
    first = sent[0]
    assert rt.queue.complete(first.item_id, first.lease)
    assert loop.tick(now) == 1
    assert len(loop.leases) == 4  # the completed one is still in the book until its task discards it


def test_upkeep_renews_held_leases_and_forgets_lost_ones(rt, make_batch, settings):
    rt.settings = settings.replace(lease_seconds=2.0)
    make_batch(2)
    sent: list = []
    loop = loop_for(rt, 2, sent)
    loop.tick(time.time())
    held, lost = sent
    for c in sent:  # both tasks start running
        assert loop.leases.start(c.item_id, c.lease)
    rt.queue.complete(lost.item_id, lost.lease)
    for _ in range(6):  # well past one lease: renewal keeps `held` alive
        time.sleep(0.5)
        loop.upkeep()
    assert rt.queue.lease_current(held.item_id, held.lease)
    assert loop.leases.items() == [(held.item_id, held.lease)]


def test_a_lease_whose_task_never_starts_is_not_renewed_and_its_item_goes_back(rt, make_batch, settings):
    """A revoked or lost run_item message: its lease runs out within one lease of the claim, and is requeued."""
    rt.settings = settings.replace(lease_seconds=1.0)
    batch = make_batch(2)
    sent: list = []
    loop = loop_for(rt, 2, sent)
    claimed = time.monotonic()
    loop.tick(time.time())
    running, never = sent
    assert loop.leases.start(running.item_id, running.lease)  # only one task starts
    back = wait_for(
        lambda: (loop.upkeep() or True) and queued(rt, batch) == 1 and time.monotonic(), 10, "the item to go back"
    )
    assert back - claimed < rt.settings.lease_seconds + 1.0  # its lease plus a pass of the loop on a loaded machine
    assert rt.queue.lease_current(running.item_id, running.lease)  # the running task's lease was renewed
    assert loop.leases.items() == [(running.item_id, running.lease)]  # and the other left the book
    assert not loop.leases.start(never.item_id, never.lease)  # a task starting this late is stale


def test_a_pass_after_data_loss_rebuilds_the_queue(rt, make_batch):
    batch = make_batch(3)
    sent: list = []
    loop = loop_for(rt, 1, sent)
    loop.tick(time.time())
    rt.redis.flushdb()
    assert loop.tick(time.time() + 60) == 1  # upkeep is due: it sees tidal:built gone and rebuilds
    assert queued(rt, batch) == 2 and {c.item_id for c in sent} == {sent[0].item_id}


def test_a_settled_item_wakes_the_idle_loop_at_once(rt, make_batch, settings):
    """Room freed on the node is filled without sleeping out the idle period (the engine would run short)."""
    rt.settings = settings.replace(claim_idle_seconds=30.0)
    make_batch(3)
    sent: list = []
    loop = loop_for(rt, 1, sent)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(sent) == 1, 10, what="the first claim")
        time.sleep(0.3)  # the loop is now idle, waiting out its 30 s: the gate is full
        first = sent[0]
        settled = time.monotonic()
        rt.queue.complete(first.item_id, first.lease)  # as record() does, then the task gives the lease up
        loop.leases.discard(first.item_id, first.lease)
        wait_for(lambda: len(sent) == 2, 10, what="the second claim")
        assert time.monotonic() - settled < 2.0
    finally:
        loop.stop()
        thread.join(10)
    assert not thread.is_alive()  # stop() wakes the waiting loop too
