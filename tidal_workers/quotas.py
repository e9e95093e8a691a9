"""Per-tenant quotas, counted in SQL: open batches, stored bytes, and enqueued tokens per model.

Limits come from ``Settings.limits_for(tenant)`` (``TIDAL_LIMIT_*`` defaults, ``TIDAL_TENANT_LIMITS`` per tenant).
Each decision counts and then writes in one transaction that first takes the tenant's row (``lock_tenant``), so
two creates racing for a tenant's last slot are decided one after the other, on SQLite and PostgreSQL alike.

How each is answered, as OpenAI answers its own:

- enqueued tokens: the batch fails validation with ``token_limit_exceeded``, its message naming the limit (a large
  file's batch already at create, with no ingest, when its first lines alone are over: ``ingest.token_floor``);
- open batches: ``POST /v1/batches`` answers 429 ``batch_limit_exceeded``;
- stored bytes (files and frozen KV): ``POST /v1/files`` answers 400 ``storage_limit_exceeded``, as does
  ``POST /v1/batches`` while the tenant is at the limit (its results would need room), and ingest splits no item of
  a tenant at the limit (no more KV frozen). A batch's output and error files count as files once written; finalize
  writes them even past the limit (they hold the only copy of work done and billed), so a tenant overshoots by at
  most the files of the batches it had already started.
"""

from __future__ import annotations

from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.orm import Session

from config import Settings
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Tenant

#: Statuses whose batches hold their enqueued tokens: work accepted and not yet over.
UNFINISHED = (BatchStatus.in_progress.value, BatchStatus.finalizing.value, BatchStatus.cancelling.value)
#: Statuses that count as open batches.
OPEN = (BatchStatus.validating.value, *UNFINISHED)


def lock_tenant(session: Session, tenant: str) -> None:
    """Hold the tenant's row until the transaction ends, so its quota decisions run one at a time.

    A write, not SELECT ... FOR UPDATE: SQLite has no row locks, but its first write takes the database's write
    lock; PostgreSQL locks the row. (The value written is the one already there.)
    """
    session.execute(update(Tenant).where(Tenant.id == tenant).values(created_at=Tenant.created_at))


def open_batches(session: Session, tenant: str) -> int:
    return (
        session.scalar(select(func.count()).select_from(Batch).where(Batch.tenant_id == tenant, Batch.status.in_(OPEN)))
        or 0
    )


def stored_bytes(session: Session, tenant: str) -> int:
    """The tenant's files and the frozen KV its batches hold (the phase split's, as beat's retention sweep last
    measured it): both are bytes the tenant keeps on the deployment's storage."""
    files = select(func.coalesce(func.sum(File.bytes), 0)).where(File.tenant_id == tenant, File.deleted.is_(False))
    frozen = select(func.coalesce(func.sum(Batch.kv_stored_bytes), 0)).where(Batch.tenant_id == tenant)
    return (session.scalar(files) or 0) + (session.scalar(frozen) or 0)


def enqueued_tokens(session: Session, tenant: str, model: str) -> int:
    return (
        session.scalar(
            select(func.coalesce(func.sum(Batch.enqueued_tokens), 0)).where(
                Batch.tenant_id == tenant, Batch.model == model, Batch.status.in_(UNFINISHED)
            )
        )
        or 0
    )


def token_limit_message(session: Session, settings: Settings, tenant: str, model: str, tokens: int) -> str | None:
    """Why a batch of ``tokens`` estimated tokens for ``model`` may not start now, or None if it may."""
    limit = settings.limits_for(tenant).tokens_for(model)
    held = enqueued_tokens(session, tenant, model)
    if held + tokens <= limit:
        return None
    return (
        f"Enqueued token limit reached for {model} for tenant {tenant}. Limit: {limit:,} enqueued tokens; this batch "
        f"needs {tokens:,} (estimated) and unfinished batches hold {held:,}. Please try again once some in_progress "
        "batches have been completed."
    )


def open_batch_message(session: Session, settings: Settings, tenant: str) -> str | None:
    limit = settings.limits_for(tenant).open_batches
    if open_batches(session, tenant) < limit:
        return None
    return (
        f"Open batch limit reached for tenant {tenant}. Limit: {limit:,} batches validating, in progress, "
        "finalizing or cancelling. Please try again once some of them have finished, or cancel some."
    )


def storage_use(session: Session, settings: Settings, tenant: str) -> tuple[int, int]:
    """(bytes ``tenant`` stores now, its limit)."""
    return stored_bytes(session, tenant), settings.limits_for(tenant).stored_bytes


def batch_storage_message(session: Session, settings: Settings, tenant: str) -> str | None:
    """Why ``tenant`` may not start a batch now (its stored bytes are at its limit), or None if it may."""
    stored, limit = storage_use(session, settings, tenant)
    if stored < limit:
        return None
    return (
        f"Storage limit reached for tenant {tenant}. Limit: {limit:,} bytes of files; {stored:,} are stored, and a "
        "batch's output and error files need room. Delete files you no longer need, or wait for them to expire."
    )


def storage_message(settings: Settings, tenant: str, stored: int, adding: int) -> str | None:
    limit = settings.limits_for(tenant).stored_bytes
    if stored + adding <= limit:
        return None
    return (
        f"Storage limit reached for tenant {tenant}. Limit: {limit:,} bytes of files; {stored:,} are stored"
        + (f" and this upload adds at least {adding:,}" if adding else "")
        + ". Delete files you no longer need, or wait for them to expire."
    )


__all__ = [
    "OPEN",
    "UNFINISHED",
    "batch_storage_message",
    "enqueued_tokens",
    "lock_tenant",
    "open_batch_message",
    "open_batches",
    "storage_message",
    "storage_use",
    "stored_bytes",
    "token_limit_message",
]
