"""The periodic re-score: each open batch's observed rate, laxity and priority, written to SQL and the queue.

Beat runs ``rescore`` every ``rescore_seconds`` (task ``tidal.sweep.rescore``).
Per in-progress batch it feeds the batch's :class:`RateEstimator` with its
settled count (completed + failed): its ``observed_rate``. Its laxity is its
tenant's: a tenant's batches of one model are drained earliest deadline first
at the tenant's share, so one estimator per (tenant, model) is fed the items
all of them settle, and ``tenant_laxities`` gives each batch the slack it has
in that schedule (issue 37, M2: a batch that waits behind its sibling is not
late). The pass writes ``Batch.priority``, ``laxity_seconds`` and
``observed_rate`` (the ``tidal`` extension object and the gauges read them),
and re-scores the batch in Redis only when its priority moved: one ``ZADD XX``
whatever the batch's size. Workers read ``Batch.priority`` at each submission,
so an escalation also reaches items already claimed. The pass also rebuilds
``tidal:urgent``, the batches past ``floor_urgency`` whose tenants the claim
loop's floor admits past a closed gate.

The estimators' state lives in Redis (``tidal:rate:{batch}``, and
``tidal:trate:...`` per tenant and model with each batch's last settled count),
not SQL: it is rewritten every few seconds for every open batch, it needs no
migration, and it is rebuildable in the only sense that matters: losing it
starts the estimate over (a batch reads "no rate yet" and sits at its window's
laxity until a τ of evidence comes back). It expires after 4 τ unwatched, by
when the old state would weigh e⁻⁴ ≈ 2 % of the next reading anyway.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import math
import time
import typing as t

import redis
from sqlalchemy import select
from sqlalchemy import update

from tidal_workers import keys
from tidal_workers.policy.laxity import RateEstimator
from tidal_workers.policy.laxity import floor_engaged
from tidal_workers.policy.laxity import priority_for
from tidal_workers.policy.laxity import settled_since
from tidal_workers.policy.laxity import tenant_laxities
from tidal_workers.policy.laxity import urgency
from tidal_workers.queue import score_priority
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus

STATE_TTL_TAUS = 4


@dataclasses.dataclass(frozen=True)
class Rescored:
    batch_id: str
    priority: int
    laxity_seconds: float | None  # the tenant's schedule's; None: its tenant is not draining at all (rate 0), -inf
    observed_rate: float | None  # the batch's own; None: no rate yet
    urgency: float
    moved: bool  # the queue score was changed by this pass


def estimator_from(h: dict[str, str], tau: float) -> RateEstimator:
    """The estimator stored as ``tidal:rate:{batch}`` (a fresh one if the hash is gone)."""
    if not h:
        return RateEstimator(tau=tau)
    return RateEstimator(
        tau=tau,
        last_at=float(h["last_at"]),
        last_done=int(h["last_done"]),
        mean=float(h["mean"]),
        weight=float(h["weight"]),
        seen_completion=h["seen"] == "1",
    )


MEMBER = "b:"  # a tenant estimator's field prefix: b:{batch} -> the batch's settled count at the last pass


def members_from(h: dict[str, str]) -> dict[str, int]:
    """The batches a tenant estimator (``tidal:trate:...``) saw at its last pass, with their settled counts then."""
    return {k[len(MEMBER) :]: int(v) for k, v in h.items() if k.startswith(MEMBER)}


def _save_estimator(
    pipe: redis.client.Pipeline, key: str, est: RateEstimator, ttl: float, members: cabc.Mapping[str, int]
) -> None:
    pipe.delete(key)  # members that left go with the old hash
    pipe.hset(
        key,
        mapping={
            "last_at": repr(est.last_at),
            "last_done": est.last_done,
            "mean": repr(est.mean),
            "weight": repr(est.weight),
            "seen": int(est.seen_completion),
            **{MEMBER + batch: done for batch, done in members.items()},
        },
    )
    pipe.expire(key, max(1, math.ceil(ttl)))


def _observe_tenant(
    pipe: redis.client.Pipeline,
    key: str,
    state: dict[str, str],
    members: dict[str, int],
    settled: cabc.Mapping[str, int],
    now: float,
    tau: float,
) -> float | None:
    """Feeds a tenant's estimator for one model the items its batches settled since the last pass (``members``: its
    open batches' settled counts; ``settled`` also holds those of the batches that left since); returns its rate."""
    before = members_from(state)
    seen = {batch: settled[batch] for batch in before if batch in settled} | members
    est = estimator_from(state, tau)
    est = est.observe(now, est.last_done + settled_since(before, seen))
    _save_estimator(pipe, key, est, STATE_TTL_TAUS * tau, members)
    return est.rate


def rescore(rt: Runtime, now: float | None = None) -> list[Rescored]:
    """One pass over every in-progress batch; returns what it computed, batch by batch."""
    now = time.time() if now is None else now
    s, tau = rt.settings, rt.settings.rate_tau_seconds
    with rt.store.read() as session:
        rows = session.execute(
            select(Batch.id, Batch.tenant_id, Batch.model, Batch.expires_at, Batch.total, Batch.completed, Batch.failed)
            .where(Batch.status == BatchStatus.in_progress.value)
            .order_by(Batch.id)
        ).all()
    groups: dict[tuple[str, str], list[t.Any]] = {}  # (model, tenant) -> its open batches
    for row in rows:
        groups.setdefault((row.model, row.tenant_id), []).append(row)
    with rt.redis.pipeline(transaction=False) as p:
        for row in rows:
            p.hget(keys.batch(row.id), "score")
            p.hgetall(keys.rate(row.id))
        for model, tenant in groups:
            p.hgetall(keys.tenant_rate(model, tenant))
        stored = p.execute()
    n = len(rows)
    scores, batch_states, tenant_states = stored[: 2 * n : 2], stored[1 : 2 * n : 2], stored[2 * n :]
    settled = {row.id: row.completed + row.failed for row in rows}
    settled |= _settled(rt, {b for h in tenant_states for b in members_from(h)} - settled.keys())
    laxity: dict[str, float] = {}
    with rt.redis.pipeline(transaction=False) as p:
        rates = []
        for row, state in zip(rows, batch_states):
            est = estimator_from(state, tau).observe(now, settled[row.id])
            _save_estimator(p, keys.rate(row.id), est, STATE_TTL_TAUS * tau, {})
            rates.append(est.rate)
        for ((model, tenant), members), state in zip(groups.items(), tenant_states):
            counts = {row.id: settled[row.id] for row in members}
            rate = _observe_tenant(p, keys.tenant_rate(model, tenant), state, counts, settled, now, tau)
            schedule = [(row.expires_at, row.total - settled[row.id]) for row in members]
            laxity.update(zip(counts, tenant_laxities(now, schedule, rate)))
        p.execute()
    out, urgent = [], []
    for row, score, rate in zip(rows, scores, rates):
        lax = laxity[row.id]
        u = urgency(lax, s.escalation_horizon_seconds)
        priority = priority_for(u, s.batch_priority_min, s.sla_strict)
        moved = score is not None and score_priority(score) != priority
        if floor_engaged(u, s.floor_urgency):
            urgent.append(row.id)
        out.append(Rescored(row.id, priority, lax if math.isfinite(lax) else None, rate, u, moved))
    with rt.store.transaction() as session:
        for r in out:
            session.execute(
                update(Batch)
                .where(Batch.id == r.batch_id, Batch.status == BatchStatus.in_progress.value)
                .values(priority=r.priority, laxity_seconds=r.laxity_seconds, observed_rate=r.observed_rate)
            )
    # SQL first: a worker submitting between the two writes already sends the new priority.
    expires = {row.id: row.expires_at for row in rows}
    for r in out:
        if r.moved:
            rt.queue.rescore(r.batch_id, r.priority, expires[r.batch_id])
    rt.queue.set_urgent(urgent)
    return out


def _settled(rt: Runtime, batch_ids: set[str]) -> dict[str, int]:
    """The settled counts of batches a tenant's estimator saw open that are open no more (their final counts)."""
    if not batch_ids:
        return {}
    with rt.store.read() as session:
        rows = session.execute(
            select(Batch.id, Batch.completed, Batch.failed).where(Batch.id.in_(sorted(batch_ids)))
        ).all()
    return {row.id: row.completed + row.failed for row in rows}


__all__ = ["Rescored", "estimator_from", "rescore"]
