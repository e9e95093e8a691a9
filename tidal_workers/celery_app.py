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
from config.celery import sending_app
from tidal_workers import execute  # noqa: F401  (registers the shared tasks on every app)
from tidal_workers import sweeps  # noqa: F401  (registers the shared tasks on every app)
from tidal_workers.claim import ClaimStep
from tidal_workers.context import ContextStep
from tidal_workers.metrics import MetricsStep


def make_celery(settings: Settings, ops: bool = False) -> Celery:
    """The app of a GPU node's worker (claim thread, metrics), or with ``ops`` of an ops worker: the same tasks and
    metrics on ``ops_metrics_port``, but no claim thread (it claims nothing and has no engine to check)."""
    app = sending_app(settings)
    app.tidal_settings = settings
    app.tidal_ops = ops
    app.steps["worker"].add(ContextStep)
    app.steps["worker"].add(MetricsStep)
    if not ops:
        app.steps["consumer"].add(ClaimStep)
    return app


app = make_celery(load_settings())
