"""Revision 0009 (the reclaim and finalize attempt caps) upgrades a store at 0008, the previous head, that holds work
in flight, on SQLite and PostgreSQL: a pending item starts at 0 reclaims and a `finalizing` batch at 0 finalize
attempts, and both caps count on from there; the downgrade gives 0008's schema back with the rows kept."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from tests.support.migrations import store_at
from tests.support.worker_helpers import wait_lease_expired
from tidal_workers import finalize
from tidal_workers.enqueue import enqueue_batch
from tidal_workers.reclaim import Fate
from tidal_workers.reclaim import reclaim
from tidal_workers.runtime import Runtime
from tidal_workers.store.migrate import alembic_config
from tidal_workers.store.migrate import upgrade
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item

T = 1_700_000_000


def _batch(batch_id: str, status: str, completed: int) -> dict:
    return {
        "id": batch_id,
        "tenant_id": "acme",
        "endpoint": "/v1/chat/completions",
        "model": "m",
        "input_file_id": "file-a",
        "completion_window": "24h",
        "status": status,
        "created_at": T,
        "in_progress_at": T,
        "finalizing_at": T if status == "finalizing" else None,
        "expires_at": 2 * T,
        "total": 1,
        "completed": completed,
        "failed": 0,
        "input_tokens": 0,
        "cached_tokens": 0,
        "output_tokens": 0,
        "reasoning_tokens": 0,
        "priority": 100,
        "enqueued_tokens": 0,
        "seq": 1 if status == "finalizing" else 2,
    }


def _item(batch_id: str, status: str) -> dict:
    return {
        "batch_id": batch_id,
        "line": 1,
        "ordinal": 0,
        "custom_id": f"{batch_id}-0",
        "url": "/v1/chat/completions",
        "body": '{"model": "m", "messages": []}',
        "status": status,
        "attempts": 1 if status == "completed" else 0,
        "response_status": 200 if status == "completed" else None,
        "response_body": '{"ok": true}' if status == "completed" else None,
        "input_tokens": 0,
        "cached_tokens": 0,
        "output_tokens": 0,
        "reasoning_tokens": 0,
    }


def _store_at_0008(url: str) -> sa.Engine:
    rows = {
        "tenants": [{"id": "acme", "created_at": T}],
        "files": [
            {
                "id": "file-a",
                "tenant_id": "acme",
                "filename": "in.jsonl",
                "purpose": "batch",
                "bytes": 1,
                "lines": 1,
                "created_at": T,
                "expires_at": 2 * T,
                "status": "processed",
                "blob": "file-a",
                "deleted": False,
                "seq": 1,
            }
        ],
        # One batch whose finalizer died (left `finalizing`), one running with an item in flight.
        "batches": [_batch("batch_f", "finalizing", 1), _batch("batch_r", "in_progress", 0)],
        "items": [_item("batch_f", "completed"), _item("batch_r", "pending")],
    }
    return store_at(url, "0008", rows)


def test_0009_upgrades_a_store_at_0008_with_work_in_flight(empty_store_url, settings):
    engine = _store_at_0008(empty_store_url)
    upgrade(engine)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT batch_id, reclaims FROM items ORDER BY batch_id")).all() == [
            ("batch_f", 0),
            ("batch_r", 0),
        ]
        assert c.execute(sa.text("SELECT id, finalize_attempts FROM batches ORDER BY id")).all() == [
            ("batch_f", 0),
            ("batch_r", 0),
        ]

    rt = Runtime(settings.replace(database_url=empty_store_url))
    rt.redis.flushdb()
    try:
        enqueue_batch(rt, "batch_r")
        (claim,) = rt.queue.claim("dying-node", 1, 0.2, ("m",))  # its worker dies: the lease is never renewed
        wait_lease_expired(rt, claim.item_id)
        assert [r.fate for r in reclaim(rt)] == [Fate.requeued]
        assert finalize.finish_finalizing(rt, "batch_f")  # reconcile's call for the batch a dead finalizer left
        with rt.store.read() as s:
            assert s.get(Item, claim.item_id).reclaims == 1
            done = s.get(Batch, "batch_f")
            assert (done.status, done.finalize_attempts) == ("completed", 1) and done.output_file_id
    finally:
        rt.redis.flushdb()
        rt.close()

    command.downgrade(alembic_config(engine), "0008")
    with engine.connect() as c:
        assert "reclaims" not in {col["name"] for col in sa.inspect(c).get_columns("items")}
        assert "finalize_attempts" not in {col["name"] for col in sa.inspect(c).get_columns("batches")}
        assert c.execute(sa.text("SELECT count(*) FROM items")).scalar() == 2
    engine.dispose()
