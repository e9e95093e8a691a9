"""Celery's configuration, as a function of Settings (so tests and each process build their own)."""

from __future__ import annotations

import typing as t

from config.settings import Settings
from tidal_workers import keys

OPS_QUEUE = "tidal.ops"  # ingest and the sweeps; every worker consumes it besides its own worker-direct queue


def _sweep(task: str, period: float) -> dict[str, t.Any]:
    # `expires`: a sweep nobody ran within its period is dropped, not piled up behind a dead ops worker.
    return {"task": task, "schedule": period, "options": {"queue": OPS_QUEUE, "expires": period}}


def celery_config(settings: Settings) -> dict[str, t.Any]:
    return {
        "broker_url": settings.celery_broker_url,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": OPS_QUEUE,
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
            "tidal-expire": _sweep("tidal.sweep.expire", settings.expiry_seconds),
            "tidal-reclaim": _sweep("tidal.sweep.reclaim", settings.reclaim_seconds),
            "tidal-reconcile": _sweep("tidal.sweep.reconcile", settings.reconcile_seconds),
            "tidal-rescore": _sweep("tidal.sweep.rescore", settings.rescore_seconds),
        },
    }
