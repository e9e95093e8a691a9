"""GET /health (liveness) and GET /ready (SQL, Redis and file storage answer), without a key."""

from __future__ import annotations

import httpx

from tidal_api import create_app
from tidal_engine.serve import free_port
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
