"""Issue 37, M2 at small scale, on real Redis and SQL and a simulated clock: a tenant that splits its work into many
batches gets no escalation, no extra floor and no more than its weight of the claims."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from sqlalchemy import update

from tests.support.worker_helpers import batch_row
from tidal_workers.claim import ClaimLoop
from tidal_workers.context import WorkerContext
from tidal_workers.gate import FixedGate
from tidal_workers.leases import LeaseBook
from tidal_workers.policy.laxity import floor_slots
from tidal_workers.rescore import rescore
from tidal_workers.store.models import Batch

SECONDS = 180  # three time constants of the rate estimate


@pytest.fixture
def settings(settings):
    """Stalls read as rate 0 after a minute; globex weighs twice acme; a gate of two items a second, no prefetch."""
    return settings.replace(
        rate_tau_seconds=60.0,
        dispatch_prefetch=0,
        floor_rate=1.0,
        tenant_limits=json.dumps({"globex": {"weight": 2}}),
    )


def test_many_stalled_batches_of_one_tenant_neither_escalate_nor_crowd_out_another(rt, make_batch):
    """Acme opens 8 batches (320 items, due in 24 h), globex one (400 items). Acme's claims drain its batches one at
    a time, so 7 of them complete nothing for minutes: they used to read rate 0 after a tau, go to priority 1 (claimed
    before globex's priority 100) and each get a floor past the gate. Now acme's work reads as acme's: a third of the
    claims (its weight) drain it in minutes, nothing escalates, the floor admits nothing, and globex keeps its two
    thirds."""
    acme = [make_batch(40) for _ in range(8)]
    globex = make_batch(400, tenant="globex")
    owner = dict.fromkeys(acme, "acme") | {globex: "globex"}
    book = LeaseBook()
    sent: list[tuple[float, str]] = []  # (simulated time, tenant) per claim
    clock = [0.0]

    def send(claims):
        for c in claims:
            rt.queue.complete(c.attempt)
            book.discard(c.attempt)
            sent.append((clock[0], owner[c.batch_id]))
        with rt.store.transaction() as s:  # the engine answered at once: the batches' counts follow
            for batch_id, n in Counter(c.batch_id for c in claims).items():
                s.execute(update(Batch).where(Batch.id == batch_id).values(completed=Batch.completed + n))
        return claims

    loop = ClaimLoop(WorkerContext(rt, book), FixedGate(2), send)
    floor_claims: list = []
    loop.floor = _recording(loop.floor, floor_claims)  # type: ignore[method-assign]
    t0 = time.time()
    escalated = 0
    for k in range(SECONDS):
        clock[0] = t0 + k
        if k % 5 == 0:  # beat's re-score period
            escalated = max(escalated, sum(r.priority < 100 for r in rescore(rt, t0 + k) if r.batch_id in acme))
        loop.tick(t0 + k)
        assert book.floor_held() <= floor_slots(loop.threads, rt.settings.floor_share)

    assert escalated == 0 and {batch_row(rt, b).priority for b in acme} == {100}
    assert rt.queue.urgent() == set() and floor_claims == []
    late = Counter(tenant for at, tenant in sent if at >= t0 + 60)  # past the first tau
    assert late["globex"] == 2 * late["acme"]


def _recording(floor, claims: list):
    """``ClaimLoop.floor``, keeping what it claims in ``claims``."""

    def run(*args):
        got = floor(*args)
        claims.extend(got)
        return got

    return run
