"""A worker's /health and /ready, served beside its /metrics on TIDAL_WORKER_METRICS_PORT."""

from __future__ import annotations

import psutil
import pytest
import requests

from tests.support.wait import wait_for
from tidal_engine.serve import free_port
from tidal_workers.health import Check


@pytest.fixture
def settings(settings):
    return settings.replace(worker_metrics_port=free_port())


def test_worker_ready_follows_its_dependencies_and_its_engine_preflight(worker, celery_app, stub, settings):
    base = f"http://127.0.0.1:{settings.worker_metrics_port}"

    def ready() -> requests.Response:
        return requests.get(base + "/ready", timeout=10)

    with worker():
        wait_for(lambda: requests.get(base + "/health", timeout=2).json() == {"status": "ok"}, what="/health")
        r = ready()
        assert r.status_code == 200, r.text
        assert r.json() == {
            "status": "ready",
            "checks": {"sql": "ok", "redis": "ok", "storage": "ok", "preflight": "ok"},
        }

        # /ready answers from checks up to READY_CACHE_SECONDS old: a change shows within that
        stub.health = 503  # the engine is up but not healthy: the default preflight fails
        wait_for(lambda: ready().status_code == 503, timeout=5, what="/ready 503")
        assert ready().json()["checks"]["preflight"] == f"{stub.url}/health answered 503"

        stub.health = 200
        # The hook an engine preflight sets: its own verdict replaces the /health probe.
        celery_app.tidal_context.preflight = lambda: Check("preflight", False, "engine does not serve model 'm'")
        said = "engine does not serve model 'm'"
        wait_for(lambda: ready().json()["checks"]["preflight"] == said, timeout=5, what="the hook's verdict")
        assert ready().status_code == 503

        assert "tidal_gate_target" in requests.get(base + "/metrics", timeout=10).text
        assert listening_on(settings.worker_metrics_port) == {"127.0.0.1"}  # TIDAL_WORKER_METRICS_HOST's default


def test_the_ops_worker_serves_metrics_and_readiness_of_its_dependencies(rt, settings):
    """`tidal worker --ops` has no engine: its /ready is SQL, Redis and storage, on TIDAL_OPS_METRICS_PORT."""
    from celery.contrib.testing.worker import start_worker

    from tidal_workers.celery_app import make_celery

    ops = settings.replace(ops_metrics_port=free_port(), worker_metrics_port=0, worker_metrics_host="127.0.0.2")
    base = f"http://127.0.0.2:{ops.ops_metrics_port}"
    app = make_celery(ops, "control")  # the part that serves the ops worker's endpoints
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, loglevel="WARNING"):
        wait_for(lambda: requests.get(base + "/health", timeout=2).json() == {"status": "ok"}, what="/health")
        r = requests.get(base + "/ready", timeout=10)
        assert (r.status_code, r.json()) == (
            200,
            {"status": "ready", "checks": {"sql": "ok", "redis": "ok", "storage": "ok"}},
        )
        assert "tidal_queue_depth" in requests.get(base + "/metrics", timeout=10).text
        assert listening_on(ops.ops_metrics_port) == {"127.0.0.2"}  # TIDAL_WORKER_METRICS_HOST, not every address


def listening_on(port: int) -> set[str]:
    """The addresses this process listens on at ``port``."""
    return {
        c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port
    }
