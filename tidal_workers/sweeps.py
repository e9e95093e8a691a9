"""Beat's periodic sweeps and the finalize task (on the ``tidal.ops`` queue: the ops worker's control process), and
the ``tidal.ingest`` task (on the ``tidal.ingest`` queue: the ops worker's ingest process).

Every sweep is idempotent, so a sweep that fires twice, or races a worker
doing the same thing, changes nothing the second time. Claim threads also
reclaim and rebuild on their own, so recovery never waits on beat alone.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from celery import Task
from celery import shared_task
from sqlalchemy import select

from tidal_workers import finalize
from tidal_workers import frozen
from tidal_workers import task_names
from tidal_workers.context import worker_context
from tidal_workers.enqueue import rebuild
from tidal_workers.ingest import after_failed_attempt
from tidal_workers.ingest import expire_unvalidated
from tidal_workers.ingest import give_up
from tidal_workers.ingest import ingest_batch
from tidal_workers.ingest import request_ingest
from tidal_workers.ingest import resend_due
from tidal_workers.reclaim import reclaim
from tidal_workers.rescore import rescore
from tidal_workers.retention import sweep as retention_sweep
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus

log = logging.getLogger(__name__)


def expire_due(rt: Runtime, now: float | None = None) -> list[str]:
    """Expire every batch past its expires_at, in progress or still validating; returns the ids this call expired."""
    now = time.time() if now is None else now
    with rt.store.read() as s:
        due = list(
            s.scalars(select(Batch.id).where(Batch.status == BatchStatus.in_progress.value, Batch.expires_at <= now))
        )
    return [batch_id for batch_id in due if finalize.expire(rt, batch_id)] + expire_unvalidated(rt, now)


def reconcile(rt: Runtime, now: float | None = None) -> int:
    """Rebuild the queue from SQL, send ingest again for batches left `validating` (or fail them once their ingest
    attempts are used up), and finalize batches whose finalizer never ran or died (or fail them once their finalize
    attempts are used up: ``finalize.retry_due`` spaces the attempts); returns items queued."""
    now = time.time() if now is None else now
    queued = rebuild(rt)
    stuck_since = now - rt.settings.reconcile_seconds
    with rt.store.read() as s:
        unvalidated = s.execute(
            select(Batch.id, Batch.created_at, Batch.ingest_started_at, Batch.ingest_attempts).where(
                Batch.status == BatchStatus.validating.value,
                Batch.created_at <= now - rt.settings.ingest_resend_seconds,
            )
        ).all()
        done = list(
            s.scalars(
                select(Batch.id).where(
                    Batch.status == BatchStatus.in_progress.value, Batch.completed + Batch.failed >= Batch.total
                )
            )
        )
        cancelling = list(s.scalars(select(Batch.id).where(Batch.status == BatchStatus.cancelling.value)))
        finalizing = s.execute(
            select(Batch.id, Batch.finalizing_at, Batch.finalize_attempts).where(
                Batch.status == BatchStatus.finalizing.value, Batch.finalizing_at <= stuck_since
            )
        ).all()
    for batch_id, created_at, started_at, attempts in unvalidated:
        if now < resend_due(rt.settings, created_at, started_at, attempts):
            continue  # an attempt may still be running
        if attempts < rt.settings.ingest_attempts:
            request_ingest(rt, batch_id)
        else:
            give_up(rt, batch_id, "stopped before it finished (its process died: killed, or out of memory)")
    for batch_id in done + cancelling:
        finalize.perform_finalize(rt, batch_id)
    for batch_id, since, attempts in finalizing:  # `since` is never NULL here: the query compared it
        if now < finalize.retry_due(rt.settings, since or 0.0, attempts):
            continue  # an attempt may still be running, or the last one failed only just now
        try:
            finalize.finish_finalizing(rt, batch_id)
        except Exception:  # counted; the next pass tries again: one batch's fault never stalls the others'
            log.exception("batch %s: finalize attempt %d failed", batch_id, attempts + 1)
    return queued


# A request is sent once, by the item task that settled the batch's last item: a transient failure (the SQL store
# busy or restarting) is retried here, so the batch does not wait for beat's reconcile.
@shared_task(name=task_names.FINALIZE, bind=True, autoretry_for=(Exception,), retry_backoff=1, max_retries=8)
def finalize_task(self: Task, batch_id: str) -> bool:
    """Someone found the batch's work over (or the batch cancelling): finalize it here, on the ops worker."""
    return finalize.perform_finalize(worker_context(self.app).rt, batch_id)


@shared_task(name=task_names.SWEEP_EXPIRE, bind=True)
def expire_task(self: Task) -> int:
    return len(expire_due(worker_context(self.app).rt))


@shared_task(name=task_names.SWEEP_RECLAIM, bind=True)
def reclaim_task(self: Task) -> int:
    return len(reclaim(worker_context(self.app).rt))


@shared_task(name=task_names.SWEEP_RECONCILE, bind=True)
def reconcile_task(self: Task) -> int:
    return reconcile(worker_context(self.app).rt)


@shared_task(name=task_names.SWEEP_RESCORE, bind=True)
def rescore_task(self: Task) -> int:
    """Laxity re-score of every open batch; returns how many batches changed score."""
    return sum(r.moved for r in rescore(worker_context(self.app).rt))


@shared_task(name=task_names.SWEEP_RETENTION, bind=True)
def retention_task(self: Task) -> dict[str, int | list[str]]:
    """Expired files, finished batches' item rows, old idempotency keys, ended batches' frozen KV (after billing
    what open batches hold); returns what it deleted."""
    rt = worker_context(self.app).rt
    report = retention_sweep(rt)
    kv = frozen.sweep(rt)
    return {**dataclasses.asdict(report), "kv_deleted": kv.deleted, "kv_freed_bytes": kv.freed_bytes}


@shared_task(name=task_names.INGEST, bind=True, max_retries=None)  # batches.ingest_attempts bounds the retries
def ingest_task(self: Task, batch_id: str) -> None:
    """On the ops worker's ingest process; a batch whose tenant runs its ``TIDAL_INGESTS_PER_TENANT`` ingests
    waits in SQL (``ingest_batch`` answers False) until one of them ends and sends it again."""
    rt = worker_context(self.app).rt
    try:
        ingest_batch(rt, batch_id, rt.settings.ingests_per_tenant)
    except Exception as exc:
        delay = after_failed_attempt(rt, batch_id, exc)
        if delay is not None:
            raise self.retry(exc=exc, countdown=delay) from exc
