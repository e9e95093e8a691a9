"""The claim loop and the renewal thread against real Redis and SQL: the gate's target plus the prefetch bounds what
a node holds, leases are renewed, claims that never started are given back, data loss rebuilds."""

from __future__ import annotations

import threading
import time

from tests.support.wait import wait_for
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import redis_now
from tidal_workers import keys
from tidal_workers.claim import ClaimLoop
from tidal_workers.context import WorkerContext
from tidal_workers.gate import FixedGate
from tidal_workers.leases import LeaseBook
from tidal_workers.renewal import Renewal


def loop_for(rt, target: int, sent: list):
    def send(claims):
        sent.extend(claims)
        return claims

    return ClaimLoop(WorkerContext(rt, LeaseBook()), FixedGate(target), send)


def test_claims_up_to_the_gate_target_plus_the_prefetch_minus_what_it_holds(rt, make_batch, settings):
    rt.settings = settings.replace(dispatch_prefetch=2, worker_threads=8)
    make_batch(10)
    sent: list = []
    loop = loop_for(rt, 3, sent)
    now = time.time()
    assert loop.tick(now) == 5 and rt.queue.inflight(rt.settings.node) == 5
    assert loop.leases.target == 3  # the engine tokens the tasks wait for
    assert loop.tick(now) == 0  # target and prefetch are full
    first = sent[0]
    assert rt.queue.complete(first.attempt)
    loop.leases.discard(first.attempt)  # released, as the task does after its result
    assert loop.tick(now) == 1
    assert len(loop.leases) == 5


def test_nothing_is_prefetched_while_the_gate_is_closed(rt, make_batch, settings):
    rt.settings = settings.replace(dispatch_prefetch=2, floor_rate=0.0)
    make_batch(4)
    assert loop_for(rt, 0, []).tick(time.time()) == 0


def test_renewal_keeps_held_leases_and_forgets_lost_ones(rt, make_batch, settings):
    """Renewal sets a held lease's expiry to Redis's clock plus the lease; a lease lost is dropped from the book.

    Asserted on the expiry Redis stores rather than by outliving a short lease between sleeps: a loaded machine
    can stall past a 2 s lease between two renewals.
    """
    rt.settings = settings.replace(lease_seconds=60.0, dispatch_prefetch=0)
    make_batch(2)
    sent: list = []
    loop = loop_for(rt, 2, sent)
    renewal = Renewal(WorkerContext(rt, loop.leases))
    loop.tick(time.time())
    held, lost = sent
    assert loop.leases.start(held.attempt)  # its task runs (one that never starts is given back)
    rt.queue.complete(lost.attempt)
    claimed = rt.redis.zscore(keys.INFLIGHT, str(held.item_id))
    wait_for(lambda: redis_now(rt) - (claimed - 60.0) > 0.05, 30, what="Redis's clock to move on")
    before = redis_now(rt)
    renewal.once()
    renewed = rt.redis.zscore(keys.INFLIGHT, str(held.item_id))
    assert before + 60.0 - 1e-3 <= renewed <= redis_now(rt) + 60.0 + 1e-3 and renewed > claimed
    assert rt.queue.lease_current(held.attempt)
    assert loop.leases.attempts() == [held.attempt]


def test_a_claim_whose_task_never_starts_is_given_back(rt, make_batch, settings):
    """A revoked or lost run_item message: within about a lease of its claim the renewal thread gives it back to the
    queue at its ordinal, for any node, while the claim whose task runs keeps its lease; a task starting that late
    finds itself stale."""
    rt.settings = settings.replace(lease_seconds=3.0, dispatch_prefetch=0)  # renewals well inside it, under load
    batch = make_batch(3)
    sent: list = []
    loop = loop_for(rt, 2, sent)
    renewal = Renewal(WorkerContext(rt, loop.leases))
    renewal.once()  # the first pass's rebuild, before the claims
    loop.tick(time.time())
    running, never = sent
    assert loop.leases.start(running.attempt)  # only one task starts
    wait_for(lambda: (renewal.once() or True) and queued(rt, batch) == 2, 30, "the unstarted claim to go back")
    assert not rt.queue.lease_current(never.attempt)
    assert rt.queue.lease_current(running.attempt)  # the running task's lease was renewed
    assert loop.leases.attempts() == [running.attempt]  # and the other left the book
    assert not loop.leases.start(never.attempt)  # a task starting this late is stale
    (again,) = rt.queue.claim("node-b", 1, 30, ["m"])
    assert again.item_id == never.item_id and again.attempt.number == never.attempt.number + 1


def test_renewal_rebuilds_the_queue_at_start_and_after_data_loss(rt, make_batch):
    batch = make_batch(3, enqueue=False)
    renewal = Renewal(WorkerContext(rt, LeaseBook()))
    renewal.once()  # the first pass rebuilds from SQL
    assert queued(rt, batch) == 3
    rt.redis.flushdb()
    renewal.once()  # it sees tidal:built gone and rebuilds
    assert queued(rt, batch) == 3


class WatchedEvent(threading.Event):
    """The lease book's wake-up event, telling the test when the loop has gone idle on it."""

    def __init__(self) -> None:
        super().__init__()
        self.idle = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.idle.set()
        return super().wait(timeout)


def test_a_settled_item_wakes_the_idle_loop_at_once(rt, make_batch, settings):
    """Room freed on the node is filled without sleeping out the idle period (the engine would run short).

    The loop idles for 30 s; the test waits until it is idle (an event), settles an item, and gives the second
    claim 20 s: it can arrive in time only if settling woke the loop.
    """
    rt.settings = settings.replace(claim_idle_seconds=30.0, dispatch_prefetch=0)
    make_batch(3)
    sent: list = []
    loop = loop_for(rt, 1, sent)
    released = loop.leases.released = WatchedEvent()
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(sent) == 1, 10, what="the first claim")
        assert released.idle.wait(20), "the loop never went idle with the gate full"
        first = sent[0]
        rt.queue.complete(first.attempt)  # as record() does, then the task gives the lease up
        loop.leases.discard(first.attempt)
        wait_for(lambda: len(sent) == 2, 20, what="the second claim, before the 30 s idle period ends")
    finally:
        loop.stop()
        thread.join(10)
    assert not thread.is_alive()  # stop() wakes the waiting loop too
