"""gunicorn's configuration for `tidal serve`, taken from Settings (TIDAL_BIND, TIDAL_API_WORKERS, ...)."""

from config import load_settings

_settings = load_settings()

bind = _settings.bind
workers = _settings.api_workers
threads = _settings.api_threads
worker_class = "gthread"
preload_app = True  # migrate and sync keys once, in the master, before forking
timeout = 120  # a large upload is still one request
accesslog = "-"


def child_exit(server, worker):
    """Fold a dead worker's /metrics samples away (prometheus_client multiprocess mode)."""
    from tidal_api.metrics import multiprocess_mode

    if multiprocess_mode():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
