"""Liveness and readiness, for compose's healthchecks and for load balancers.

``/health`` answers 200 while the process serves at all (liveness). ``/ready`` answers 200 when the process can
do its work, else 503 with what failed: SQL, Redis and the file storage answer; for a worker, also its engine
preflight (``WorkerContext.preflight``). The API serves both on its own port (``tidal_api/health.py``); a worker
serves them next to its ``/metrics`` on ``TIDAL_WORKER_METRICS_PORT`` (``worker_http_app``). Both answer from checks
at most ``READY_CACHE_SECONDS`` old (``CachedChecks``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import typing as t
from wsgiref.simple_server import WSGIRequestHandler
from wsgiref.simple_server import WSGIServer
from wsgiref.simple_server import make_server

import requests
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import CollectorRegistry
from sqlalchemy import text

from config import Settings
from tidal_workers.runtime import Runtime

ENGINE_TIMEOUT_SECONDS = 2.0
READY_CACHE_SECONDS = 1.0  # /ready answers from checks at most this old


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = "ok"  # why not, when not ok


def _probe(name: str, call: t.Callable[[], object]) -> Check:
    try:
        call()
    except Exception as exc:  # whatever the client raises, the answer is "not ready, because ..."
        return Check(name, False, f"{type(exc).__name__}: {exc}"[:300])
    return Check(name, True)


def _select_one(rt: Runtime) -> None:
    with rt.store.read() as s:
        s.execute(text("SELECT 1"))


def dependency_checks(rt: Runtime) -> list[Check]:
    """What every process needs: SQL, Redis and the file storage answering."""
    return [
        _probe("sql", lambda: _select_one(rt)),
        _probe("redis", rt.redis.ping),
        _probe("storage", rt.blobs.ping),
    ]


def engine_answers(settings: Settings) -> Check:
    """The worker's default preflight: the co-located engine's ``/health`` answers 200."""
    url = settings.vllm_url.rstrip("/") + "/health"
    try:
        status = requests.get(url, timeout=ENGINE_TIMEOUT_SECONDS).status_code
    except requests.RequestException as exc:
        return Check("preflight", False, f"{url} unreachable: {type(exc).__name__}")
    return Check("preflight", True) if status == 200 else Check("preflight", False, f"{url} answered {status}")


def readiness(checks: t.Iterable[Check]) -> tuple[int, dict[str, t.Any]]:
    """(HTTP status, body) of ``/ready``: 200 when every check passed, else 503."""
    checks = list(checks)
    ok = all(c.ok for c in checks)
    return (200 if ok else 503), {
        "status": "ready" if ok else "not_ready",
        "checks": {c.name: c.detail for c in checks},
    }


class CachedChecks:
    """``checks()`` run at most once every ``ttl`` seconds, its answer shared meanwhile: ``/ready`` needs no key, so
    a flood of it must not cost a SQL, a Redis and a storage call (on S3 a HeadBucket) per request."""

    def __init__(
        self,
        checks: t.Callable[[], list[Check]],
        ttl: float = READY_CACHE_SECONDS,
        clock: t.Callable[[], float] = time.monotonic,
    ):
        self._checks, self._ttl, self._clock = checks, ttl, clock
        self._lock = threading.Lock()
        self._last: tuple[float, list[Check]] | None = None  # (when the checks ended, their answer)

    def __call__(self) -> list[Check]:
        with self._lock:  # requests that come in while a check runs wait for its answer rather than run their own
            if self._last is None or self._clock() - self._last[0] >= self._ttl:
                checks = self._checks()
                self._last = (self._clock(), checks)
            return self._last[1]


LIVE = (200, {"status": "ok"})

WSGIApp = t.Callable[[dict[str, t.Any], t.Callable[..., t.Any]], t.Iterable[bytes]]


def worker_http_app(registry: CollectorRegistry, ready: t.Callable[[], list[Check]]) -> WSGIApp:
    """The worker's HTTP endpoint: ``/health``, ``/ready`` (from ``ready()``), and ``registry`` on every other path."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, t.Any], start_response: t.Callable[..., t.Any]) -> t.Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/health", "/ready"):
            return metrics(environ, start_response)
        status, body = LIVE if path == "/health" else readiness(ready())
        payload = json.dumps(body).encode()
        reason = "OK" if status == 200 else "Service Unavailable"
        start_response(
            f"{status} {reason}", [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
        )
        return [payload]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: t.Any) -> None:  # a scrape every few seconds is not news
        pass


def serve_http(app: WSGIApp, host: str, port: int) -> WSGIServer:
    """Serve ``app`` from a daemon thread; ``shutdown()`` and ``server_close()`` the result to stop it."""
    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="tidal-worker-http", daemon=True).start()
    return server
