"""Backup and restore as docs/deployment.md writes them: a backup taken mid-batch, restored onto a fresh stack
(a new database, an empty Redis, a copy of the blobs), where the batch completes with every line exactly once.

The store is the session's kind: on PostgreSQL the backup is pg_dump and the restore pg_restore into a new database;
on SQLite, SQLite's online `.backup` and a copy. Redis is never backed up: it holds only what SQL rebuilds.
"""

from __future__ import annotations

import io
import json

import pytest

from tests.support.fault_helpers import start_worker
from tests.support.stack_helpers import assert_every_line_once
from tests.support.stack_helpers import backup
from tests.support.stack_helpers import custom_ids
from tests.support.stack_helpers import db_upgrade
from tests.support.stack_helpers import fresh_database
from tests.support.stack_helpers import restore
from tests.support.stack_helpers import stack_settings
from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tidal_api import create_app
from tidal_api.cli.services import PrivateRedis
from tidal_api.cli.services import kill_group
from tidal_workers.runtime import Runtime
from tidal_workers.store import api_keys

N = 30


def _create_batch(rt: Runtime, tag: str, n: int) -> str:
    """Upload and create through the API (in process), as a client would."""
    lines = [
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": cid}]},
            }
        )
        + "\n"
        for cid in custom_ids(tag, n)
    ]
    client = create_app(runtime=rt).test_client()
    auth = {"Authorization": "Bearer acme-key"}
    f = client.post(
        "/v1/files", headers=auth, data={"purpose": "batch", "file": (io.BytesIO("".join(lines).encode()), "in.jsonl")}
    )
    assert f.status_code == 200, f.get_data()
    b = client.post(
        "/v1/batches",
        headers=auth,
        json={"input_file_id": f.get_json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    )
    assert b.status_code == 200, b.get_data()
    return b.get_json()["id"]


@pytest.mark.slow
def test_a_backup_taken_mid_batch_restores_onto_a_fresh_stack(settings, stub, children, tmp_path):
    base = stack_settings(settings, stub)
    fresh_redis = PrivateRedis(tmp_path)
    try:
        with fresh_database(base, "old-stack") as old, fresh_database(base, "new-stack") as new:
            new = new.replace(redis_url=fresh_redis.url)
            rt = Runtime(old)
            try:
                rt.redis.flushdb()
                rt.store.migrate()
                api_keys.sync(rt.store)
                batch = _create_batch(rt, "r", N)
                stub.delay = 0.3
                children.append(worker := start_worker(old, "old-node", tmp_path))
                wait_for(
                    lambda: batch_row(rt, batch).completed >= 4 and rt.queue.inflight("old-node") > 0,
                    120,
                    what="the batch to be mid-way",
                )
                backup(old, tmp_path / "backup")  # while the worker runs on: a backup of a live stack
                kill_group(worker)  # the old stack is lost
            finally:
                rt.redis.flushdb()
                rt.close()

            restore(tmp_path / "backup", new)
            db_upgrade(new)
            rt = Runtime(new)
            try:
                restored = batch_row(rt, batch)
                assert restored.status == "in_progress" and 4 <= restored.completed < N  # as it was mid-batch
                assert rt.redis.dbsize() == 0  # nothing of the old Redis: the queue is rebuilt from SQL
                stub.delay = 0.02
                children.append(start_worker(new, "new-node", tmp_path))
                children.append(start_worker(new, "control", tmp_path, ops=True))
                assert_every_line_once(rt, batch, "r", N)
                with create_app(runtime=rt).test_client() as client:  # the restored input file serves too
                    content = client.get(
                        f"/v1/files/{restored.input_file_id}/content", headers={"Authorization": "Bearer acme-key"}
                    )
                assert content.status_code == 200 and content.get_data().count(b"\n") == N
            finally:
                rt.close()
    finally:
        fresh_redis.stop()
