"""Upgrading a running deployment: the previous release's store and queue, holding in-flight batches, upgraded to
this one's; the batches complete with nothing lost and nothing twice.

The previous release (``PREVIOUS_RELEASE``, taken from git) writes its own state: its API creates the batches, its
worker ingests them and runs items against the stub engine until it is killed (kill -9) mid-batch, leaving its
leases, fencing counters and ready sets in Redis in its key layout and the store at its schema (Alembic 0001);
a third batch is left `validating` with its ingest message in the broker. Then this release upgrades the store
(`tidal db upgrade`: every Alembic revision up to head) and starts: a GPU node's worker (which rebuilds the queue
from SQL) and the ops worker. At the next release, point ``PREVIOUS_RELEASE`` at this one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from tests.support.deploy_helpers import ROOT
from tests.support.fault_helpers import start_worker
from tests.support.stack_helpers import assert_every_line_once
from tests.support.stack_helpers import db_upgrade
from tests.support.stack_helpers import fresh_database
from tests.support.stack_helpers import scalar
from tests.support.stack_helpers import stack_settings
from tests.support.wait import wait_for
from tests.support.worker_helpers import settings_env
from tidal_api.cli.services import kill_group
from tidal_workers.runtime import Runtime
from tidal_workers.store.migrate import MIGRATIONS
from tidal_workers.store.migrate import alembic_config
from tidal_workers.store.models import Base

PREVIOUS_RELEASE = "877f0d3"  # schema 0001; its Redis key layout is in its docs/architecture.md
BATCHES = {"a": 40, "b": 12}  # ingested and running when the old worker dies
LATE = ("c", 6)  # created after it died: still `validating`, its ingest message waiting in tidal.ops

# The previous release's own API, in process: upload and create batches as its clients did.
OLD_CLIENT = """
import io, json, sys
from config import load_settings
from tidal_api import create_app
from tidal_workers.runtime import Runtime

rt = Runtime(load_settings())
rt.store.migrate()
rt.store.sync_keys()
client = create_app(runtime=rt).test_client()
auth = {"Authorization": "Bearer acme-key"}
for tag, n in json.loads(sys.argv[1]):
    lines = [
        json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "m", "messages": [{"role": "user", "content": f"{tag}-{i}"}]}}) + "\\n"
        for i in range(n)
    ]
    f = client.post("/v1/files", headers=auth,
                    data={"purpose": "batch", "file": (io.BytesIO("".join(lines).encode()), "in.jsonl")})
    assert f.status_code == 200, f.get_data()
    b = client.post("/v1/batches", headers=auth, json={
        "input_file_id": f.get_json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert b.status_code == 200, b.get_data()
    print(b.get_json()["id"])
"""


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE], capture_output=True)
    assert archive.returncode == 0, f"the upgrade test needs git history ({PREVIOUS_RELEASE}): {archive.stderr!r}"
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def _old_batches(settings, tree: Path, batches: list[tuple[str, int]]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", OLD_CLIENT, json.dumps(batches)],
        cwd=tree,
        env={**settings_env(settings), "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def _held_from_old_node(s, client, stub) -> bool:
    held = stub.held()
    leased = client.zrange("tidal:node:old-node:inflight", 0, -1)
    return any(scalar(s, "SELECT custom_id FROM items WHERE id = :id", id=int(i)) in held for i in leased)


@pytest.mark.slow
def test_in_flight_batches_of_the_previous_release_complete_after_the_upgrade(
    settings, stub, previous_release, children, tmp_path
):
    # every batch through the ingest task, as large files go
    base = stack_settings(settings, stub, sync_validate_bytes=0)
    with fresh_database(base, "upgrade") as s:
        client = redis.Redis.from_url(s.redis_url, decode_responses=True)
        client.flushdb()
        a, b = _old_batches(s, previous_release, list(BATCHES.items()))
        stub.delay = 0.3
        old = start_worker(s, "old-node", tmp_path, tree=previous_release)
        children.append(old)
        wait_for(
            lambda: (scalar(s, "SELECT completed FROM batches WHERE id = :id", id=a) or 0) >= 4,
            120,
            what="the previous release's worker to be mid-batch",
        )
        # Killed while the engine holds one of its requests unanswered, so an item of its is surely unsettled (its
        # lease count alone also counts items committed but not yet released, which leave nothing to rerun).
        stub.hold_answers()
        wait_for(
            lambda: _held_from_old_node(s, client, stub), 120, what="the old worker to have a request in the engine"
        )
        kill_group(old)
        stub.release_answers()
        (c,) = _old_batches(s, previous_release, [LATE])

        # What the previous release left: its schema, its queue and leases, a message for its ingest task.
        assert scalar(s, "SELECT version_num FROM alembic_version") == "0001"
        assert scalar(s, "SELECT status FROM batches WHERE id = :id", id=c) == "validating"
        assert client.zcard("tidal:batches") > 0 and client.hlen("tidal:lease") > 0
        assert client.zcard(f"tidal:b:{a}:ready") + client.zcard(f"tidal:b:{b}:ready") > 0
        assert any(json.loads(m)["headers"]["task"] == "tidal.ingest" for m in client.lrange("tidal.ops", 0, -1))
        done_before = scalar(s, "SELECT count(*) FROM items WHERE status = 'completed'")
        assert 4 <= done_before < sum(BATCHES.values())

        db_upgrade(s)
        heads = ScriptDirectory.from_config(alembic_config(None)).get_heads()  # type: ignore[arg-type]
        assert [scalar(s, "SELECT version_num FROM alembic_version")] == heads and MIGRATIONS.is_dir()

        stub.delay = 0.02
        children.append(start_worker(s, "new-node", tmp_path))
        children.append(start_worker(s, "control", tmp_path, ops=True))
        rt = Runtime(s)
        try:
            for batch_id, (tag, n) in zip((a, b, c), [*BATCHES.items(), LATE]):
                assert_every_line_once(rt, batch_id, tag, n)
            assert scalar(s, "SELECT count(*) FROM items WHERE attempts > 1") >= 1  # the old leases' items ran again
        finally:
            rt.close()
            client.flushdb()


def test_the_migrations_build_exactly_the_models_schema(rt):
    """Every schema change ships as a revision: the store the revisions build is the one the models describe."""
    with rt.store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"the models and the migrations differ (add a revision): {diff}"
