"""ClaimStep: the worker's claim thread, between the Redis queue and the worker's own Celery queue.

It lives in the consumer's lifecycle, so claiming stops when the broker
connection is lost and resumes with the consumer, with its two helpers: the
renewal thread (``renewal.py``) and, with the AIMD gate, the gate's scrape
thread. Each pass claims up to the gate's target plus ``dispatch_prefetch``,
less what the node's LeaseBook holds; the target itself bounds the node's
requests at the engine, which each task waits for (``leases.py``). Past the
gate, the floor admits each tenant with urgent batches (``tidal:urgent``, kept
by the re-score) at up to ``floor_rate`` items/s on this node through one token
bucket per tenant, however many urgent batches it has, and all tenants together
to at most ``floor_share`` of the pool (issue 37, M2), so a batch about to miss
its window still progresses when the gate is closed; those items count as held
and at the engine like any other, so an open gate simply claims that many
fewer. Split items (the phase split) are claimed
first in each pass's room, by phase, as ``policy.phase.claimable_phases``
admits: a prefill while the engine has prefill slack (the gate's reading), a
decode while the gate's target exceeds what the node holds, and either for a
batch at the split's urgency whatever the load; whole items fill the rest.
It claims only batches of the
models its engine serves (``served.py``), and nothing at all, the floor
included, while its engine is down or fails its preflight (``engine_health``:
it probes the engine instead; ``preflight.py``). Each claim becomes a ``tidal.run_item`` message on this worker's
``<hostname>.dq2`` queue with task id ``item-<id>#<attempt>``, which Flower
shows. A stopping worker claims no more and hands back what it has not sent."""

from __future__ import annotations

import logging
import math
import threading
import time
import typing as t

from celery import bootsteps
from celery.utils.nodenames import worker_direct
from celery.worker.consumer import Consumer

from tidal_workers import task_names
from tidal_workers.context import WorkerContext
from tidal_workers.context import worker_context
from tidal_workers.gate import AimdGate
from tidal_workers.gate import Gate
from tidal_workers.gate import SteppedGate
from tidal_workers.gate import make_gate
from tidal_workers.gate import pool_threads
from tidal_workers.handback import give_back_unstarted
from tidal_workers.leases import Pause
from tidal_workers.leases import trusted_until
from tidal_workers.policy.laxity import PRIORITY_MAX
from tidal_workers.policy.laxity import TokenBucket
from tidal_workers.policy.laxity import floor_slots
from tidal_workers.policy.laxity import priority_for
from tidal_workers.policy.phase import Phase
from tidal_workers.policy.phase import SplitConfig
from tidal_workers.policy.phase import claimable_phases
from tidal_workers.queue import Claim
from tidal_workers.renewal import Renewal

log = logging.getLogger(__name__)

#: How long a pass's reading of the urgent batches (``tidal:urgent``) serves the next passes: the re-score rebuilds
#: the set every ``TIDAL_RESCORE_SECONDS`` (5), and a pass runs after every release, so reading it each pass cost
#: the claim path a round trip per item for a set that had not changed.
URGENT_READ_SECONDS = 1.0

#: Publishes claims in order as run_item messages; returns those sent (it stops at the first failure).
Send = t.Callable[[list[Claim]], list[Claim]]


class ClaimLoop:
    """One node's claim loop; ``tick`` is one pass, ``run`` repeats it until stopped. It does no slow work: the
    gate's scrape, lease renewal, reclaim and rebuild run on their own threads, finalization on the ops worker."""

    def __init__(self, ctx: WorkerContext, gate: Gate, send: Send):
        self.rt, self.leases, self.engine, self.gate, self.send = ctx.rt, ctx.leases, ctx.engine, gate, send
        self.settings = ctx.rt.settings
        self.threads = pool_threads(self.settings)  # one claimed item per pool thread
        self.stopping = threading.Event()
        self.buckets: dict[str, TokenBucket] = {}  # tenant with urgent batches -> its floor bucket on this node
        self.urgent: dict[str, list[str]] = {}  # tenant -> its urgent batches, earliest deadline first
        self.floor_turn = 0  # rotates which tenant takes the floor's room first, for when it is short
        self.urgent_read_at = -math.inf  # when tidal:urgent was last read (the tick's clock)
        self.served = ctx.served  # only batches of these models are claimed here (renewal re-reads the list)
        self.split = SplitConfig()

    def floor(self, now: float, held: int, models: tuple[str, ...]) -> list[Claim]:
        """Claims the floor admits now, past the gate: a token of a tenant's bucket buys one item of its
        earliest-deadline urgent batch that has one; all tenants together hold at most the floor's slots (a share
        of the pool), taking the room in turn, and never more than the threads."""
        s, q = self.settings, self.rt.queue
        if s.floor_rate <= 0:  # the floor is off
            return []
        if not 0 <= now - self.urgent_read_at < URGENT_READ_SECONDS:  # the re-score rebuilds it every few seconds
            self.urgent_read_at = now
            self.urgent = q.urgent_by_tenant()
            self.buckets = {tenant: self.buckets.get(tenant) or TokenBucket(s.floor_rate) for tenant in self.urgent}
        room = min(self.threads - held, floor_slots(self.threads, s.floor_share) - self.leases.floor_held())
        tenants = list(self.buckets)
        self.floor_turn += 1
        first = self.floor_turn % len(tenants) if tenants else 0
        claims: list[Claim] = []
        for tenant in tenants[first:] + tenants[:first]:
            if len(claims) < room and self.buckets[tenant].take(now):
                claims += self.first_claimable(self.urgent[tenant], models)
        return claims

    def first_claimable(self, batch_ids: list[str], models: tuple[str, ...]) -> list[Claim]:
        """One item of the first of ``batch_ids`` that has one queued for a model served here (none: [])."""
        s = self.settings
        for batch_id in batch_ids:
            claim = self.rt.queue.claim_batch(s.node, batch_id, 1, s.lease_seconds, models)
            if claim:
                return claim
        return []

    def phases(self, target: int, held: int) -> list[tuple[str, int]]:
        """Phase split: the phases this pass claims split items of, decodes first (they finish items), each with the
        highest priority it takes: any batch in a phase the node's slack admits, else a batch at the split's
        urgency (its priority or below) in a phase that urgency admits."""
        cfg = self.split
        prefill_slack, decode_slack = self.gate.prefill_slack(cfg), target > held
        limits: list[tuple[str, int]] = []
        for phase in (Phase.DECODE, Phase.PREFILL):
            if phase in claimable_phases(prefill_slack, decode_slack, 0.0, cfg):
                limits.append((phase.value, PRIORITY_MAX))
            elif phase in claimable_phases(prefill_slack, decode_slack, 1.0, cfg):
                limits.append((phase.value, priority_for(cfg.decode_urgency)))
        return limits

    def tick(self, now: float) -> int:
        """Claim up to the target plus the prefetch, less what the node holds; returns how many were claimed."""
        s, q, book = self.settings, self.rt.queue, self.leases
        if not self.engine.may_claim(now):  # the engine is down or fails its preflight: claim nothing, the floor too
            return 0
        target = self.gate.poll(now, book.outstanding())
        book.set_target(target)
        held = len(book)
        models = self.served.current()
        trusted = trusted_until(time.monotonic(), s.lease_seconds)  # stamped before the claims are sent
        urgent = self.floor(now, held, models)
        ahead = s.dispatch_prefetch if target > 0 else 0  # nothing waits on a closed gate
        want = min(target + ahead, self.threads) - held - len(urgent)
        # One round trip: the split items of the phases the node admits, then whole items for the rest.
        claims = q.claim(s.node, want, s.lease_seconds, models, self.phases(target, held + len(urgent)))
        # Book leases before publishing: a task can fail and discard its lease before send() returns, and a
        # lease booked after that would be renewed forever. One that failed to publish expires and is reclaimed.
        for c in urgent:
            book.add(c.attempt, floor=True, trusted_until=trusted)
        for c in claims:
            book.add(c.attempt, trusted_until=trusted)
        claims = urgent + claims
        sent = self.send(claims) if claims else []
        for c in claims[len(sent) :]:  # send() publishes in order and stops at the first failure
            book.discard(c.attempt)
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
                # Until an attempt is released or the gate's target moves (room under target + prefetch), or the
                # idle period passes (another node enqueued, an urgent batch appeared).
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
        self.claiming: threading.Thread | None = None  # the claim loop's thread, among ``threads``
        self.threads: list[threading.Thread] = []
        self.stopping = threading.Event()

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
                            claim.attempt,  # run_item(item_id, lease)
                            task_id=claim.attempt.task_id,
                            queue=queue,
                            producer=producer,
                        )
                        sent.append(claim)
            except Exception:
                log.exception("%d claimed items not published; their leases will expire", len(claims) - len(sent))
            return sent

        ctx = worker_context(app)
        settings = ctx.rt.settings
        gate = make_gate(settings, ctx.rt.http)
        self.stopping = threading.Event()
        runs: list[tuple[str, t.Callable[[], None]]] = [("tidal-renew", Renewal(ctx).runner(self.stopping))]
        if isinstance(gate, AimdGate):  # the scrape gets a thread of its own; the claim loop reads its last target
            stepped = SteppedGate(gate, ctx.leases)
            gate_runner: Gate = stepped
            runs.append(("tidal-gate", stepped.runner(self.stopping)))
        else:
            gate_runner = gate
        self.loop = ClaimLoop(ctx, gate_runner, send)
        runs.append(("tidal-claim", self.loop.run))
        self.threads = [threading.Thread(target=run, name=name, daemon=True) for name, run in runs]
        self.claiming = self.threads[-1]
        for thread in self.threads:
            thread.start()

    def stop(self, c: Consumer) -> None:
        if self.loop is not None:
            self.stopping.set()
            self.loop.stop()
            for thread in self.threads:
                thread.join(10)
            self.loop, self.threads = None, []

    def close(self, c: Consumer) -> None:
        """The worker is stopping (Celery closes the consumer's steps only then, not on a broker reconnect): claim no
        more, pause the book so no task sends again (a prefetched one, or one in a retry backoff, hands its item
        back at once), and hand back the claims whose task has not started; requests under way finish."""
        if self.loop is None or self.claiming is None:
            return
        self.loop.stop()
        self.claiming.join(10)  # its last pass books what it claimed before the hand-back below
        ctx = worker_context(c.app)
        ctx.leases.pause(Pause.STOPPING)
        given = give_back_unstarted(ctx.rt, ctx.leases)
        log.info("worker stopping: %d claims not started went back to the queue; requests under way finish", given)

    shutdown = stop

    def info(self, c: Consumer) -> dict[str, dict[str, bool]]:
        return {"tidal_claim": {"running": self.loop is not None}}
