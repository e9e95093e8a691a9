"""Revisions 0002-0004 upgrade a store that holds data, on SQLite and PostgreSQL: stored keys get ids and stay
usable, existing files and batches are numbered in the order lists showed them, and an input file's row can go
while its batch's stays. The chain runs to the head: an existing batch is never split (0006), its items run
whole (0007), have been at no engine death (0008) and never reclaimed, and its batch has made no finalize attempt
(0009)."""

from __future__ import annotations

import hashlib

import sqlalchemy as sa

from config.settings import Settings
from tests.support.migrations import store_at
from tidal_workers.store import Store
from tidal_workers.store import api_keys
from tidal_workers.store.migrate import upgrade
from tidal_workers.store.models import File

T = 1_700_000_000


def _store_at_0001(url: str) -> sa.Engine:
    digest = hashlib.sha256(b"old-configured-key").hexdigest()
    rows = {
        "tenants": [{"id": "acme", "created_at": T}],
        "api_keys": [{"key_hash": digest, "tenant_id": "acme", "created_at": T}],
        "files": [
            {
                "id": fid,
                "tenant_id": "acme",
                "filename": "f",
                "purpose": "batch",
                "bytes": 1,
                "lines": 1,
                "created_at": at,
                "expires_at": at + 60,
                "status": "processed",
                "blob": fid,
                "deleted": False,
            }
            for fid, at in (("file-b", T), ("file-a", T), ("file-c", T + 1))
        ],
        "batches": [
            {
                "id": bid,
                "tenant_id": "acme",
                "endpoint": "/v1/chat/completions",
                "input_file_id": "file-a",
                "completion_window": "24h",
                "status": "in_progress",
                "created_at": T,
                "expires_at": T + 86_400,
                "total": 1,
                "completed": 0,
                "failed": 0,
                "input_tokens": 0,
                "cached_tokens": 0,
                "output_tokens": 0,
                "reasoning_tokens": 0,
                "priority": 100,
            }
            for bid in ("batch_z", "batch_y")
        ],
        "items": [
            {
                "batch_id": "batch_z",
                "line": 1,
                "ordinal": 0,
                "custom_id": "c",
                "url": "/v1/chat/completions",
                "body": "{}",
                "status": "pending",
                "attempts": 0,
                "input_tokens": 0,
                "cached_tokens": 0,
                "output_tokens": 0,
                "reasoning_tokens": 0,
            }
        ],
    }
    return store_at(url, "0001", rows)


def test_upgrade_with_data_present(empty_store_url, tmp_path):
    url = empty_store_url
    engine = _store_at_0001(url)
    upgrade(engine)
    with engine.connect() as c:
        files = c.execute(sa.text("SELECT id FROM files ORDER BY seq")).scalars().all()
        batches = c.execute(sa.text("SELECT id FROM batches ORDER BY seq")).scalars().all()
        key = c.execute(sa.text("SELECT id, source, revoked_at FROM api_keys")).one()
        items = c.execute(sa.text("SELECT count(*) FROM items")).scalar()
        split = c.execute(
            sa.text(
                "SELECT b.phase_split, i.phase, i.engine_deaths, i.reclaims, b.finalize_attempts"
                " FROM items i JOIN batches b ON b.id = i.batch_id"
            )
        ).one()
    assert files == ["file-a", "file-b", "file-c"]  # (created_at, id): the order lists showed before
    assert batches == ["batch_y", "batch_z"]
    assert key.id.startswith("key_") and key.source == "config" and key.revoked_at is None and items == 1
    assert tuple(split) == ("never", "whole", 0, 0, 0)
    engine.dispose()

    store = Store(
        Settings(home=str(tmp_path / "home"), database_url=url, env="dev", api_keys="acme:old-configured-key")
    )
    assert api_keys.tenant_for_key(store, "old-configured-key") == "acme"  # still valid, now under lifecycle rules
    with store.transaction() as s:  # new rows number after the old ones; an input file's row may go
        s.execute(sa.text("DELETE FROM files WHERE id = 'file-a'"))
    with store.transaction() as s:
        f = File(tenant_id="acme", filename="n", purpose="batch", bytes=1, created_at=T, blob="n")
        s.add(f)
    assert f.seq == 4
    assert api_keys.sync(store).revoked == 0
    store.dispose()
