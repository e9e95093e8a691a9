"""The worker's Celery app: ``make_celery(settings)``, plus ``app`` for ``celery -A tidal_workers.celery_app``.

Only worker processes (``tidal worker``, Flower) import this module: it registers the tasks and the
worker steps (context, metrics, the claim thread). Processes that only send (the API, beat) build
``config.celery.sending_app`` instead.

Only claimed items become Celery messages (``tidal.run_item`` on the claiming
worker's own queue); items waiting their turn stay in Redis sorted sets that
Tidal owns (see ``queue.py`` for why).
"""

from __future__ import annotations

from celery import Celery

from config import Settings
from config import load_settings
from config.celery import OPS_INGEST
from config.celery import sending_app
from tidal_workers import execute  # noqa: F401  (registers the shared tasks on every app)
from tidal_workers import sweeps  # noqa: F401  (registers the shared tasks on every app)
from tidal_workers.claim import ClaimStep
from tidal_workers.context import ContextStep
from tidal_workers.metrics import MetricsStep


def make_celery(settings: Settings, ops_part: str | None = None) -> Celery:
    """The app of a GPU node's worker (claim thread, metrics), or of one part of the ops worker (``ops_part``,
    a key of ``config.celery.OPS_PART_QUEUES``): the same tasks, no claim thread (it claims nothing and has no
    engine to check). Its control part serves the metrics on ``ops_metrics_port``; its ingest part serves none
    (one exporter per ops worker: the gauges read the same Redis and SQL)."""
    app = sending_app(settings)
    app.tidal_settings = settings
    app.tidal_ops = ops_part is not None
    app.steps["worker"].add(ContextStep)
    if ops_part != OPS_INGEST:
        app.steps["worker"].add(MetricsStep)
    if ops_part is None:
        app.steps["consumer"].add(ClaimStep)
    return app


app = make_celery(load_settings())
