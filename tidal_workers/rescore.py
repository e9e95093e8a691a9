"""The periodic re-score: each open batch's observed rate, laxity and priority, written to SQL and the queue.

Beat runs ``rescore`` every ``rescore_seconds`` (task ``tidal.sweep.rescore``).
Per in-progress batch it feeds the batch's :class:`RateEstimator` with its
settled count (completed + failed), writes ``Batch.priority``,
``laxity_seconds`` and ``observed_rate`` (the ``tidal`` extension object and
the gauges read them), and re-scores the batch in Redis only when its priority
moved: one ``ZADD XX`` whatever the batch's size. Workers read
``Batch.priority`` at each submission, so an escalation also reaches items
already claimed. The pass also rebuilds ``tidal:urgent``, the batches past
``floor_urgency`` that the claim loop's floor admits past a closed gate.

The estimator's state lives in Redis (``tidal:rate:{batch}``), not SQL: it is
rewritten every few seconds for every open batch, it needs no migration, and it
is rebuildable in the only sense that matters: losing it starts the estimate
over (a batch reads "no rate yet" and sits at its window's laxity until a τ of
evidence comes back). It expires after 4 τ unwatched, by when the old
state would weigh e⁻⁴ ≈ 2 % of the next reading anyway.
"""

from __future__ import annotations

import dataclasses
import math
import time

import redis
from sqlalchemy import select
from sqlalchemy import update

from tidal_workers import keys
from tidal_workers.policy.laxity import RateEstimator
from tidal_workers.policy.laxity import floor_engaged
from tidal_workers.policy.laxity import laxity_seconds
from tidal_workers.policy.laxity import priority_for
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
    laxity_seconds: float | None  # None: the batch is not draining at all (rate 0), laxity -inf
    observed_rate: float | None  # None: no rate yet
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


def _save_estimator(pipe: redis.client.Pipeline, batch_id: str, est: RateEstimator, ttl: float) -> None:
    key = keys.rate(batch_id)
    pipe.hset(
        key,
        mapping={
            "last_at": repr(est.last_at),
            "last_done": est.last_done,
            "mean": repr(est.mean),
            "weight": repr(est.weight),
            "seen": int(est.seen_completion),
        },
    )
    pipe.expire(key, max(1, math.ceil(ttl)))


def rescore(rt: Runtime, now: float | None = None) -> list[Rescored]:
    """One pass over every in-progress batch; returns what it computed, batch by batch."""
    now = time.time() if now is None else now
    s = rt.settings
    with rt.store.read() as session:
        rows = session.execute(
            select(Batch.id, Batch.expires_at, Batch.total, Batch.completed, Batch.failed)
            .where(Batch.status == BatchStatus.in_progress.value)
            .order_by(Batch.id)
        ).all()
    with rt.redis.pipeline(transaction=False) as p:
        for row in rows:
            p.hget(keys.batch(row.id), "score")
            p.hgetall(keys.rate(row.id))
        stored = p.execute()
    out, urgent = [], []
    with rt.redis.pipeline(transaction=False) as p:
        for row, score, state in zip(rows, stored[::2], stored[1::2]):
            done = row.completed + row.failed
            est = estimator_from(state, s.rate_tau_seconds).observe(now, done)
            _save_estimator(p, row.id, est, STATE_TTL_TAUS * s.rate_tau_seconds)
            rate = est.rate
            lax = laxity_seconds(row.expires_at, now, row.total - done, rate)
            u = urgency(lax, s.escalation_horizon_seconds)
            priority = priority_for(u, s.batch_priority_min, s.sla_strict)
            moved = score is not None and score_priority(score) != priority
            if floor_engaged(u, s.floor_urgency):
                urgent.append(row.id)
            out.append(Rescored(row.id, priority, lax if math.isfinite(lax) else None, rate, u, moved))
        p.execute()
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


__all__ = ["Rescored", "estimator_from", "rescore"]
