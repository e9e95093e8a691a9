"""Celery's configuration, as a function of Settings (so tests and each process build their own).

Like ``gunicorn.py``, this is a tool's configuration file: it may import the Tidal code it configures
(the task and queue names, RedBeat's key prefix), unlike ``settings.py``, which imports nothing of Tidal.
"""

from __future__ import annotations

import typing as t

from celery import Celery
from kombu.entity import Queue

from config.settings import Settings
from tidal_workers import keys
from tidal_workers import task_names

#: What each kind of worker consumes, besides the ``<hostname>.dq2`` queue Celery's ``worker_direct`` adds to every
#: worker. The ops worker (``tidal worker --ops``) is two Celery workers, each its own process with its own threads:
#: its control part takes ``tidal.ops`` (finalize and the sweeps), its ingest part ``tidal.ingest``, so ingests
#: holding every ingest thread never hold a finalize or a sweep back. Neither shares a process with a GPU node's
#: requests (an input file that kills its process would take the node's in-flight items with it): a GPU node's
#: worker (``tidal worker``) excludes both and runs only the items it claims.
OPS_CONTROL, OPS_INGEST = "control", "ingest"  # the ops worker's parts (`tidal worker --ops --part ...`)
OPS_PART_QUEUES = {OPS_CONTROL: (task_names.OPS_QUEUE,), OPS_INGEST: (task_names.INGEST_QUEUE,)}
GPU_WORKER_EXCLUDED_QUEUES = (task_names.OPS_QUEUE, task_names.INGEST_QUEUE)


def _sweep(task: str, period: float) -> dict[str, t.Any]:
    # `expires`: a sweep nobody ran within its period is dropped, not piled up behind a dead ops worker.
    return {"task": task, "schedule": period, "options": {"queue": task_names.OPS_QUEUE, "expires": period}}


#: kombu's Redis transport with one client per channel (tidal_workers/broker.py says why), for a Redis broker.
REDIS_TRANSPORT = "tidal_workers.broker:Transport"


def _transport(broker_url: str) -> dict[str, t.Any]:
    """Tidal's transport for a plain Redis URL; any other broker (Sentinel, AMQP, ...) keeps its own."""
    return {"broker_transport": REDIS_TRANSPORT} if broker_url.startswith(("redis://", "rediss://")) else {}


def celery_config(settings: Settings) -> dict[str, t.Any]:
    return {
        "broker_url": settings.celery_broker_url,
        **_transport(settings.celery_broker_url),
        "broker_connection_retry_on_startup": True,
        "task_default_queue": task_names.OPS_QUEUE,
        # Declared, so a worker given no queue (a test's in-process worker, Flower's view) takes both ops queues.
        "task_queues": [Queue(name) for name in (task_names.OPS_QUEUE, task_names.INGEST_QUEUE)],
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        # One message at a time per free thread: claimed items are already ordered by the
        # claim thread, and prefetched messages could not be re-ordered anyway.
        "worker_prefetch_multiplier": 1,
        # Every claimed item is sent to the claiming worker's own `<hostname>.dq2` queue.
        "worker_direct": True,
        # Flower sees each run_item (task id item-<id>#<attempt>) from sent to succeeded.
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        # Early ack (the default): the lease, not the broker, decides redelivery.
        "task_acks_late": False,
        "beat_scheduler": "redbeat.RedBeatScheduler",
        "redbeat_redis_url": settings.redis_url,
        "redbeat_key_prefix": keys.REDBEAT_PREFIX,
        "redbeat_lock_timeout": settings.beat_lock_seconds,
        "beat_max_loop_interval": min(5.0, max(0.5, settings.beat_lock_seconds / 4)),
        "beat_schedule": {
            "tidal-expire": _sweep(task_names.SWEEP_EXPIRE, settings.expiry_seconds),
            "tidal-reclaim": _sweep(task_names.SWEEP_RECLAIM, settings.reclaim_seconds),
            "tidal-reconcile": _sweep(task_names.SWEEP_RECONCILE, settings.reconcile_seconds),
            "tidal-rescore": _sweep(task_names.SWEEP_RESCORE, settings.rescore_seconds),
            "tidal-retention": _sweep(task_names.SWEEP_RETENTION, settings.retention_seconds),
        },
    }


def sending_app(settings: Settings) -> Celery:
    """A Celery app that only sends: Tidal's configuration, no task registered, no worker step.

    What the API process (and beat) build: sending needs only task names, so nothing of the
    worker (claim thread, gate, task bodies) is imported. The worker's app
    (``tidal_workers.celery_app.make_celery``) is this plus the tasks and the worker steps.
    """
    app = Celery("tidal", set_as_current=False)
    app.conf.update(celery_config(settings))
    return app
