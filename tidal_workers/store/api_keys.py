"""API keys: who a bearer key belongs to, and the keys' lifecycle (configured, created, used, revoked).

Only SHA-256 digests are stored; a key is shown once, when ``create`` makes it. Three sources:

- ``config``: ``TIDAL_API_KEYS``: ``sync`` (every API start and ``tidal db upgrade``) adds what it names and moves a
  key to the tenant it now names. A configured key the setting no longer names stays live, with a warning at each
  sync, until ``tidal keys sync --prune`` (or ``tidal keys revoke``): a maintenance shell or a staging process that
  lacks the setting must not revoke every tenant's key;
- ``cli``: ``tidal keys create``; lives until ``tidal keys revoke``;
- ``dev``: the public dev key, present only while a dev-mode process keeps writing it back.

A revoked key stays revoked, whatever the setting later says (a leaked key must not come back with a restart).
Every request looks its key up (one primary-key read), so a revocation holds from the next request on, in every
API process, with no cache to expire.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import secrets
import time

from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.orm import Session

from config.settings import DEV_KEY
from tidal_workers.store.db import Store
from tidal_workers.store.models import ApiKey
from tidal_workers.store.models import KeySource
from tidal_workers.store.models import Tenant

LAST_USED_RESOLUTION = 60  # seconds: last_used_at is written at most this often per key
KEY_PREFIX = "sk-tidal-"

log = logging.getLogger(__name__)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def hint(key: str) -> str:
    """Enough of a key to recognise it in a list, far too little to use it."""
    return key[:3] + "..." + key[-4:] if len(key) >= 16 else "..."


def generate_key() -> str:
    """A new key: 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True)
class SyncReport:
    added: int
    moved: int
    revoked: int  # configured keys the setting no longer names, revoked by a prune
    kept_revoked: int  # keys the setting names that were revoked before: they stay revoked
    unlisted: int  # configured keys the setting no longer names, left live (no prune)


def _ensure_tenant(session: Session, tenant: str, now: int) -> None:
    if session.get(Tenant, tenant) is None:
        session.add(Tenant(id=tenant, created_at=now))
        session.flush()


def sync(store: Store, prune: bool = False) -> SyncReport:
    """Store the keys ``TIDAL_API_KEYS`` names (and the dev key as dev mode says); with ``prune``, revoke the
    configured keys it no longer names (each logged), else only warn of them."""
    settings = store.settings
    now = int(time.time())
    added = moved = kept_revoked = 0
    configured: set[str] = set()
    with store.transaction() as s:
        for tenant, key in settings.configured_keys:
            source = KeySource.dev if (tenant, key) == DEV_KEY else KeySource.config
            digest = hash_key(key)
            configured.add(digest)
            _ensure_tenant(s, tenant, now)
            row = s.get(ApiKey, digest)
            if row is None:
                name = "dev mode" if source is KeySource.dev else "TIDAL_API_KEYS"
                s.add(
                    ApiKey(
                        key_hash=digest,
                        tenant_id=tenant,
                        name=name,
                        hint=hint(key),
                        source=source.value,
                        created_at=now,
                    )
                )
                added += 1
                continue
            if row.revoked_at is not None and source is not KeySource.dev:
                log.warning("TIDAL_API_KEYS names key %s, which was revoked: it stays revoked", row.id)
                kept_revoked += 1
                continue
            if row.tenant_id != tenant:
                log.warning("key %s moves from tenant %s to %s (TIDAL_API_KEYS)", row.id, row.tenant_id, tenant)
                moved += 1
            row.tenant_id, row.source, row.revoked_at = tenant, source.value, None
        live = s.scalars(
            select(ApiKey).where(ApiKey.source == KeySource.config.value, ApiKey.revoked_at.is_(None))
        ).all()
        unlisted = [row for row in live if row.key_hash not in configured]
        for row in unlisted:
            if prune:
                row.revoked_at = now
                log.warning("key %s of tenant %s left TIDAL_API_KEYS: revoked (--prune)", row.id, row.tenant_id)
            else:
                log.warning(
                    "key %s of tenant %s left TIDAL_API_KEYS: still live until `tidal keys sync --prune` "
                    "(or `tidal keys revoke %s`)",
                    row.id,
                    row.tenant_id,
                    row.id,
                )
        if settings.env != "dev":  # the dev key is public: it must not outlive dev mode
            for row in s.scalars(select(ApiKey).where(ApiKey.source == KeySource.dev.value)):
                s.delete(row)
    if prune:
        return SyncReport(added, moved, len(unlisted), kept_revoked, 0)
    return SyncReport(added, moved, 0, kept_revoked, len(unlisted))


def tenant_for_key(store: Store, key: str) -> str | None:
    """The tenant of a live (unrevoked) key, or None; notes its use, at most once a minute."""
    digest = hash_key(key)
    with store.read() as s:
        row = s.execute(
            select(ApiKey.tenant_id, ApiKey.last_used_at).where(ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None))
        ).first()
    if row is None:
        return None
    now = int(time.time())
    if row.last_used_at is None or row.last_used_at <= now - LAST_USED_RESOLUTION:
        with store.transaction() as s:
            s.execute(update(ApiKey).where(ApiKey.key_hash == digest).values(last_used_at=now))
    return str(row.tenant_id)


def has_live_key(store: Store) -> bool:
    """Whether a key other than the dev key is live: a stack with one is in production (`tidal up`)."""
    with store.read() as s:
        live = select(ApiKey.key_hash).where(ApiKey.revoked_at.is_(None), ApiKey.source != KeySource.dev.value)
        return s.scalar(live.limit(1)) is not None


def create(store: Store, tenant: str, name: str) -> tuple[ApiKey, str]:
    """A new key for ``tenant`` (created if new): (its row, the key, which is never stored)."""
    key = generate_key()
    now = int(time.time())
    with store.transaction() as s:
        _ensure_tenant(s, tenant, now)
        row = ApiKey(
            key_hash=hash_key(key),
            tenant_id=tenant,
            name=name,
            hint=hint(key),
            source=KeySource.cli.value,
            created_at=now,
        )
        s.add(row)
    return row, key


def listed(store: Store, tenant: str | None = None) -> list[ApiKey]:
    stmt = select(ApiKey).order_by(ApiKey.tenant_id, ApiKey.created_at, ApiKey.id)
    if tenant is not None:
        stmt = stmt.where(ApiKey.tenant_id == tenant)
    with store.read() as s:
        return list(s.scalars(stmt))


def revoke(store: Store, key_id: str) -> ApiKey | None:
    """Revoke the key with this id (from ``tidal keys list``); its row, or None if there is none."""
    with store.transaction() as s:
        row = s.scalars(select(ApiKey).where(ApiKey.id == key_id)).first()
        if row is not None and row.revoked_at is None:
            row.revoked_at = int(time.time())
    return row


__all__ = ["SyncReport", "create", "generate_key", "hash_key", "hint", "listed", "revoke", "sync", "tenant_for_key"]
