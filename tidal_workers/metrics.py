"""Prometheus gauges of the Redis queue (items waiting are not Celery messages, so Flower cannot see them)
and of each open batch's SLA state (priority, laxity, observed rate, as the last re-score wrote them) and progress.

Collectors read Redis and SQL at scrape time, so the numbers are never older than
the scrape and nothing has to keep gauges up to date. ``MetricsStep`` serves
them, with the gate's gauges, from each worker on ``TIDAL_WORKER_METRICS_PORT``.
"""

from __future__ import annotations

import functools
import logging
import typing as t

from celery import bootsteps
from celery.worker import WorkController
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric
from prometheus_client.registry import REGISTRY
from prometheus_client.registry import CollectorRegistry
from sqlalchemy import select

from tidal_workers.health import CachedChecks
from tidal_workers.health import dependency_checks
from tidal_workers.health import serve_http
from tidal_workers.health import worker_http_app
from tidal_workers.queue import Queue
from tidal_workers.runtime import Runtime
from tidal_workers.store import Store
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus

if t.TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)


class QueueCollector:
    def __init__(self, queue: Queue):
        self.queue = queue

    def collect(self) -> t.Iterator[Metric]:
        depth = GaugeMetricFamily(
            "tidal_queue_depth", "Items queued in Redis, by batch priority band.", labels=["band"]
        )
        for band, n in self.queue.depth_by_band().items():
            depth.add_metric([band], n)
        yield depth
        inflight = GaugeMetricFamily("tidal_inflight_items", "Items leased (in flight), by node.", labels=["node"])
        for node, n in self.queue.inflight_by_node().items():
            inflight.add_metric([node], n)
        yield inflight

    def describe(self) -> list[Metric]:
        return []  # read only at scrape time: registering must not touch Redis


class BatchCollector:
    """Per open batch: the SLA columns the re-score keeps current (a batch without a value yet is left out)."""

    GAUGES = (
        ("tidal_batch_priority", "vLLM priority the batch's items are sent at (100 = least urgent).", "priority"),
        (
            "tidal_batch_laxity_seconds",
            "Slack left: time to the deadline minus the drain at the observed rate.",
            "laxity_seconds",
        ),
        (
            "tidal_batch_observed_rate",
            "The batch's settled items per second, as the re-score estimates it.",
            "observed_rate",
        ),
    )

    def __init__(self, store: Store):
        self.store = store

    def collect(self) -> t.Iterator[Metric]:
        with self.store.read() as s:
            rows = s.execute(
                select(
                    Batch.id,
                    Batch.priority,
                    Batch.laxity_seconds,
                    Batch.observed_rate,
                    Batch.total,
                    Batch.completed,
                    Batch.failed,
                ).where(Batch.status == BatchStatus.in_progress.value)
            ).all()
        for name, doc, column in self.GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["batch"])
            for row in rows:
                value = getattr(row, column)
                if value is not None:
                    family.add_metric([row.id], value)
            yield family
        done = GaugeMetricFamily(
            "tidal_batch_done_ratio",
            "Share of the batch's requests settled (completed or failed), 0..1.",
            labels=["batch"],
        )
        for row in rows:
            if row.total:
                done.add_metric([row.id], (row.completed + row.failed) / row.total)
        yield done

    def describe(self) -> list[Metric]:
        return []


def register_queue_metrics(rt: Runtime, registry: CollectorRegistry = REGISTRY) -> QueueCollector:
    collector = QueueCollector(rt.queue)
    registry.register(collector)
    return collector


def worker_registry(rt: Runtime) -> CollectorRegistry:
    """What a worker exports: its own metrics (the gate's), the queue and open batches, read at scrape time."""
    registry = CollectorRegistry()
    registry.register(REGISTRY)  # a registry is a collector too; describe-less, so nothing is read now
    register_queue_metrics(rt, registry)
    registry.register(BatchCollector(rt.store))
    return registry


class MetricsStep(bootsteps.StartStopStep):
    """Serves ``worker_registry`` over HTTP while the worker runs (one server per worker process), with
    ``/health`` and ``/ready`` beside it; on ``ops_metrics_port`` for the ops worker."""

    requires = ("tidal_workers.context:ContextStep",)

    def __init__(self, w: WorkController, **kwargs: t.Any):
        super().__init__(w, **kwargs)
        self.server: WSGIServer | None = None

    def start(self, w: WorkController) -> None:
        ctx = w.app.tidal_context
        ops = getattr(w.app, "tidal_ops", False)  # the ops worker has no engine: its readiness is its dependencies
        port = ctx.rt.settings.ops_metrics_port if ops else ctx.rt.settings.worker_metrics_port
        if not port:
            return
        ready = CachedChecks(functools.partial(dependency_checks, ctx.rt) if ops else ctx.ready_checks)
        host = ctx.rt.settings.worker_metrics_host
        try:
            self.server = serve_http(worker_http_app(worker_registry(ctx.rt), ready), host, port)
        except OSError as exc:  # a second worker on this host: it runs, unscraped, rather than not at all
            log.warning("worker metrics not served: %s:%d: %s", host, port, exc)
            return
        log.info("worker metrics on %s:%d/metrics, liveness on /health, readiness on /ready", host, port)

    def stop(self, w: WorkController) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
