"""GET /metrics for the API: request latency by route, plus store and queue gauges read at scrape time.

Served only on the metrics port (``TIDAL_METRICS_BIND``, a second listener of the same gunicorn), never on the
API's public port, where ``/metrics`` answers 404 like any unknown URL: the figures name every tenant's batches
and each scrape runs SQL aggregates. The metrics port in turn answers nothing but ``/metrics``, ``/health`` and
``/ready`` (with each failing check's reason, which the public ``/ready`` does not tell).

Under gunicorn each worker process keeps its own histogram samples in
PROMETHEUS_MULTIPROC_DIR (set by `tidal serve`); a scrape answered by any one
worker merges all of them, so the numbers are right whichever process answers.
Store and queue figures are read from SQL and Redis at scrape time, so they
need no cross-process bookkeeping at all.
"""

from __future__ import annotations

import time
import typing as t

import prometheus_client
from flask import Blueprint
from flask import Flask
from flask import Response
from flask import g
from flask import request
from prometheus_client import multiprocess
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric
from sqlalchemy import func
from sqlalchemy import select
from werkzeug.exceptions import NotFound

from config import Settings
from tidal_api.context import current_runtime
from tidal_workers.metrics import BatchCollector
from tidal_workers.metrics import QueueCollector
from tidal_workers.store import Batch
from tidal_workers.store import BatchStatus
from tidal_workers.store import Store

REQUEST_SECONDS = prometheus_client.Histogram(
    "tidal_api_request_seconds",
    "API request latency by route template.",
    ["route", "method", "status"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
)

bp = Blueprint("metrics", __name__)


class StoreCollector:
    """Batches by status, completed items, harvested tokens and batches whose files could not be written, straight
    from SQL."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self) -> t.Iterator[Metric]:
        with self.store.read() as s:
            by_status = dict(s.execute(select(Batch.status, func.count()).group_by(Batch.status)).all())
            done, tokens = s.execute(
                select(
                    func.coalesce(func.sum(Batch.completed), 0),
                    func.coalesce(func.sum(Batch.input_tokens + Batch.output_tokens), 0),
                )
            ).one()
            # Only finalize's attempt cap fails a batch that has made finalize attempts (ingest fails `validating`
            # ones); batch rows stay, so the count only grows.
            unwritten = s.scalar(
                select(func.count())
                .select_from(Batch)
                .where(Batch.status == BatchStatus.failed.value, Batch.finalize_attempts > 0)
            )
        batches = GaugeMetricFamily("tidal_batches", "Batches by status.", labels=["status"])
        for status in BatchStatus:
            batches.add_metric([status.value], by_status.get(status.value, 0))
        yield batches
        yield CounterMetricFamily(
            "tidal_items_completed", "Batch items completed (billed); rate() gives items/s.", value=int(done)
        )
        yield CounterMetricFamily(
            "tidal_harvested_tokens", "Input plus output tokens of completed batch items.", value=int(tokens)
        )
        yield CounterMetricFamily(
            "tidal_finalize_failed_batches",
            "Batches failed with finalize_failed: their output and error files could not be written in "
            "TIDAL_FINALIZE_ATTEMPTS attempts (their results are kept in SQL).",
            value=int(unwritten or 0),
        )

    def describe(self) -> list[Metric]:
        return []


@bp.get("/metrics")
def metrics() -> Response:
    rt = current_runtime()
    registry = prometheus_client.CollectorRegistry()
    if multiprocess_mode():
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_LocalRequests())
    registry.register(StoreCollector(rt.store))
    registry.register(QueueCollector(rt.queue))
    registry.register(BatchCollector(rt.store))
    return Response(prometheus_client.generate_latest(registry), mimetype=prometheus_client.CONTENT_TYPE_LATEST)


def multiprocess_mode() -> bool:
    """True when prometheus_client was imported in multiprocess mode (gunicorn via `tidal serve`)."""
    return prometheus_client.values.ValueClass is not prometheus_client.values.MutexValue


class _LocalRequests:
    """One process (tests, the dev server): the request histogram from the default registry."""

    def collect(self) -> t.Iterable[Metric]:
        return REQUEST_SECONDS.collect()

    def describe(self) -> list[Metric]:
        return []


BOTH_PORTS = frozenset({"health.health", "health.ready"})


def metrics_port(settings: Settings) -> str | None:
    return settings.metrics_bind.rpartition(":")[2] if settings.metrics_bind else None


def on_metrics_port() -> bool:
    """Whether this request came in on the metrics listener: the port of the socket it arrived on, never the Host
    header (on a unix socket, gunicorn takes SERVER_PORT from the Host header: ``Host: x:9180`` would pass)."""
    port = metrics_port(current_runtime().settings)
    return port is not None and _listener_port(request.environ) == port


def _listener_port(environ: dict[str, t.Any]) -> str | None:
    """The local port of the connection (None on a unix socket); under another WSGI server than gunicorn (the
    test client, werkzeug's), its SERVER_PORT, which such servers take from their own listener."""
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return environ.get("SERVER_PORT")
    address = sock.getsockname()
    return str(address[1]) if isinstance(address, tuple) else None


def _route_by_port() -> None:
    """/metrics only on the metrics port; there, only /metrics, /health and /ready."""
    if request.endpoint in BOTH_PORTS:
        return
    if (request.endpoint == "metrics.metrics") != on_metrics_port():
        raise NotFound()


def init_app(app: Flask) -> None:
    app.before_request(_route_by_port)

    @app.before_request
    def _start_timer() -> None:
        g.tidal_started = time.perf_counter()

    @app.after_request
    def _observe(response: Response) -> Response:
        started = g.pop("tidal_started", None)
        if started is not None:
            route = request.url_rule.rule if request.url_rule else "unmatched"
            REQUEST_SECONDS.labels(route, request.method, str(response.status_code)).observe(
                time.perf_counter() - started
            )
        return response

    app.register_blueprint(bp)
