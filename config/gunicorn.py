"""gunicorn's configuration for `tidal serve`, taken from Settings (TIDAL_BIND, TIDAL_API_WORKERS, ...)."""

from __future__ import annotations

import typing as t

from config import load_settings

if t.TYPE_CHECKING:
    from gunicorn.arbiter import Arbiter
    from gunicorn.workers.base import Worker

_settings = load_settings()

# The public API, and the metrics listener (/metrics is answered only there: tidal_api/metrics.py).
bind = [_settings.bind, *([_settings.metrics_bind] if _settings.metrics_bind else [])]
workers = _settings.api_workers
threads = _settings.api_threads
worker_class = "gthread"
preload_app = True  # migrate and sync keys once, in the master, before forking
timeout = 120  # a large upload is still one request
accesslog = "-"


def on_starting(server: Arbiter) -> None:
    """Refusals gunicorn writes itself (a request line or header past its limits) answer JSON, as the app does."""
    from tidal_api.gunicorn_errors import install

    install()


def child_exit(server: Arbiter, worker: Worker) -> None:
    """Fold a dead worker's /metrics samples away (prometheus_client multiprocess mode)."""
    from tidal_api.metrics import multiprocess_mode

    if multiprocess_mode():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
