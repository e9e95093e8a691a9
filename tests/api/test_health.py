"""GET /health (liveness) and GET /ready (SQL, Redis and file storage answer), without a key."""

from __future__ import annotations

import time

import httpx
from sqlalchemy import event

from tidal_api import create_app
from tidal_engine.serve import free_port
from tidal_workers.health import READY_CACHE_SECONDS
from tidal_workers.health import CachedChecks
from tidal_workers.health import Check
from tidal_workers.health import dependency_checks
from tidal_workers.runtime import Runtime


def test_health_and_ready_on_a_working_api(live_api):
    assert httpx.get(live_api.url + "/health").json() == {"status": "ok"}
    r = httpx.get(live_api.url + "/ready")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "checks": {"sql": "ok", "redis": "ok", "storage": "ok"}}


def test_ready_names_each_dependency_that_is_down(settings, tmp_path):
    down = settings.replace(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        database_url=f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/nowhere",
        blob_dir=str(tmp_path / "blobs"),
        metrics_bind="127.0.0.1:9180",  # never bound here: the test client only says which port it came in on
    )
    runtime = Runtime(down)
    runtime.blobs.root.rmdir()  # the storage is gone too
    client = create_app(runtime=runtime).test_client()
    # the public port names what failed, never why: a reason would show internal hosts, ports and paths
    r = client.get("/ready")
    assert r.status_code == 503
    assert r.json == {"status": "not_ready", "checks": dict.fromkeys(("sql", "redis", "storage"), "unavailable")}
    # the metrics port (an operator's) tells the reasons
    metrics_port = down.metrics_bind.rpartition(":")[2]
    r = client.get("/ready", environ_overrides={"SERVER_PORT": metrics_port})
    assert r.status_code == 503 and r.json["status"] == "not_ready"
    checks = r.json["checks"]
    assert checks["redis"].startswith("ConnectionError") and checks["sql"].startswith("OperationalError"), checks
    assert checks["storage"] == f"StorageUnavailable: {tmp_path / 'blobs'} is not a writable directory"
    assert client.get("/health").status_code == 200  # alive all the same: restarting it would not help
    runtime.close()


def test_a_flood_of_ready_requests_checks_the_dependencies_once_a_second(rt):
    """/ready needs no key: 200 requests cost one SQL, Redis and storage check per second, not one each."""
    selects: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        if statement.strip().upper() == "SELECT 1":
            selects.append(statement)

    event.listen(rt.store.engine, "before_cursor_execute", count)
    client = create_app(runtime=rt).test_client()
    started = time.monotonic()
    try:
        assert all(client.get("/ready").status_code == 200 for _ in range(200))
    finally:
        event.remove(rt.store.engine, "before_cursor_execute", count)
    elapsed = time.monotonic() - started
    assert 1 <= len(selects) <= 1 + elapsed // READY_CACHE_SECONDS, (len(selects), elapsed)


def test_cached_checks_run_again_once_their_answer_is_older_than_the_limit(rt):
    now = [0.0]
    runs: list[list[Check]] = []

    def checks() -> list[Check]:
        runs.append(dependency_checks(rt))  # the real checks: SQL, Redis and storage
        return runs[-1]

    cached = CachedChecks(checks, ttl=1.0, clock=lambda: now[0])
    assert cached() is cached() is runs[0] and len(runs) == 1
    now[0] = 0.99
    assert cached() is runs[0] and len(runs) == 1
    now[0] = 1.0  # a second after the checks ended: checked again, and that answer is kept in turn
    assert cached() is runs[1] and cached() is runs[1] and len(runs) == 2
