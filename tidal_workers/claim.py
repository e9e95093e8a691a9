"""ClaimStep: the worker's claim thread, between the Redis queue and the worker's own Celery queue.

It lives in the consumer's lifecycle, so claiming stops when the broker
connection is lost and resumes with the consumer. Each pass it renews the
leases of this process's running tasks (every third of a lease), reclaims
expired ones, rebuilds the queue from SQL if Redis lost its data, and, unless
the engine is down (``engine_health``: then it claims nothing and probes
``/health``), claims up to the gate's in-flight target, only of the models its
engine serves (``served.py``). Past the gate, the floor admits each urgent batch (``tidal:urgent``,
kept by the re-score) at up to ``floor_rate`` items/s on this node through a
per-batch token bucket, so a batch about to miss its window still progresses
when the gate is closed; those items count as in flight like any other, so an
open gate simply claims that many fewer. Each claim becomes a ``tidal.run_item`` message on this worker's
``<hostname>.dq2`` queue with task id ``item-<id>#<attempt>``, which Flower shows.
"""

from __future__ import annotations

import logging
import threading
import time
import typing as t

from celery import bootsteps
from celery.utils.nodenames import worker_direct
from celery.worker.consumer import Consumer

from tidal_workers import task_names
from tidal_workers.context import WorkerContext
from tidal_workers.context import worker_context
from tidal_workers.enqueue import rebuild
from tidal_workers.gate import Gate
from tidal_workers.gate import make_gate
from tidal_workers.policy.laxity import TokenBucket
from tidal_workers.queue import Claim
from tidal_workers.served import ServedModels
from tidal_workers.sweeps import reclaim

log = logging.getLogger(__name__)

#: Publishes claims in order as run_item messages; returns those sent (it stops at the first failure).
Send = t.Callable[[list[Claim]], list[Claim]]


class ClaimLoop:
    """One node's claim loop; ``tick`` is one pass, ``run`` repeats it until stopped."""

    def __init__(self, ctx: WorkerContext, gate: Gate, send: Send):
        self.rt, self.leases, self.engine, self.gate, self.send = ctx.rt, ctx.leases, ctx.engine, gate, send
        self.settings = ctx.rt.settings
        self.stopping = threading.Event()
        self._next_upkeep = 0.0
        self._started = False
        self.buckets: dict[str, TokenBucket] = {}  # urgent batch -> its floor bucket on this node
        self.served = ServedModels(ctx.rt)  # only batches of these models are claimed here

    def upkeep(self) -> None:
        """Renew our leases, requeue expired ones, and rebuild the queue at start or if Redis lost it."""
        s, q = self.settings, self.rt.queue
        lost = q.renew(s.node, self.leases.renewable(s.lease_seconds), s.lease_seconds)
        self.leases.forget(lost)
        reclaim(self.rt)
        if not self._started or not q.is_built():
            if self._started:
                log.warning("the Redis queue is gone: rebuilding it from SQL")
            rebuild(self.rt)
            self._started = True

    def floor(self, now: float, inflight: int, models: tuple[str, ...]) -> list[Claim]:
        """Claims the token buckets of urgent batches admit now, past the gate (never past the threads)."""
        s, q = self.settings, self.rt.queue
        if s.floor_rate <= 0:  # the floor is off
            return []
        self.buckets = {b: self.buckets.get(b) or TokenBucket(s.floor_rate) for b in sorted(q.urgent())}
        claims: list[Claim] = []
        for batch_id, bucket in self.buckets.items():
            while inflight + len(claims) < s.worker_threads and bucket.take(now):
                claims += q.claim_batch(s.node, batch_id, 1, s.lease_seconds, models)
        return claims

    def tick(self, now: float) -> int:
        s, q = self.settings, self.rt.queue
        if now >= self._next_upkeep:
            self.upkeep()
            self._next_upkeep = now + s.lease_seconds / 3
        if not self.engine.may_claim(now):  # the engine is down: claim nothing, the floor included
            return 0
        models = self.served.refresh(now)
        inflight = q.inflight(s.node)
        claims = self.floor(now, inflight, models)
        inflight += len(claims)
        want = min(self.gate.poll(now, inflight), s.worker_threads) - inflight
        claims += q.claim(s.node, want, s.lease_seconds, models)
        # Book leases before publishing: a task can fail and discard its lease before send() returns, and a
        # lease booked after that would be renewed forever. One that failed to publish expires and is reclaimed.
        for c in claims:
            self.leases.add(c.item_id, c.lease)
        sent = self.send(claims) if claims else []
        for c in claims[len(sent) :]:  # send() publishes in order and stops at the first failure
            self.leases.discard(c.item_id, c.lease)
        return len(claims)

    def run(self) -> None:
        released = self.leases.released
        while not self.stopping.is_set():
            released.clear()  # before the pass: a task that settles during it wakes the next wait at once
            try:
                claimed = self.tick(time.time())
            except Exception:  # Redis or the broker blinked: keep the thread, try again shortly
                log.exception("claim pass failed")
                claimed = 0
            if not claimed:
                # Until a task settles (room under the target) or the idle period passes (another node
                # enqueued, the gate opened, an urgent batch appeared).
                released.wait(self.settings.claim_idle_seconds)

    def stop(self) -> None:
        self.stopping.set()
        self.leases.released.set()


class ClaimStep(bootsteps.StartStopStep):
    """Runs the ClaimLoop in a thread while the consumer runs."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Consumer, **kwargs: t.Any):
        super().__init__(c, **kwargs)
        self.loop: ClaimLoop | None = None
        self.thread: threading.Thread | None = None

    def start(self, c: Consumer) -> None:
        app = c.app
        queue = worker_direct(c.hostname)

        def send(claims: list[Claim]) -> list[Claim]:
            sent: list[Claim] = []
            try:
                with app.producer_or_acquire() as producer:
                    for claim in claims:
                        app.send_task(
                            task_names.RUN_ITEM,
                            (claim.item_id, claim.lease),
                            task_id=claim.task_id,
                            queue=queue,
                            producer=producer,
                        )
                        sent.append(claim)
            except Exception:
                log.exception("%d claimed items not published; their leases will expire", len(claims) - len(sent))
            return sent

        ctx = worker_context(app)
        self.loop = ClaimLoop(ctx, make_gate(ctx.rt.settings), send)
        self.thread = threading.Thread(target=self.loop.run, name="tidal-claim", daemon=True)
        self.thread.start()

    def stop(self, c: Consumer) -> None:
        if self.loop is not None and self.thread is not None:
            self.loop.stop()
            self.thread.join(10)
            self.loop = self.thread = None

    def close(self, c: Consumer) -> None:
        """The worker is stopping (Celery closes the consumer's steps only then, not on a broker reconnect): hold
        every send, so items not under way go back to the queue now; requests under way finish."""
        if self.loop is not None:
            self.loop.engine.stopping()

    shutdown = stop

    def info(self, c: Consumer) -> dict[str, dict[str, bool]]:
        return {"tidal_claim": {"running": self.thread is not None}}
