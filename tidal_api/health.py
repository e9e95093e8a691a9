"""GET /health (liveness) and GET /ready (SQL, Redis and file storage answer), without a key, for healthchecks.

The public port's /ready says which check failed but not why: a reason can name internal hosts, ports and
paths. The reason is logged, and shown on the metrics port (``TIDAL_METRICS_BIND``) and the worker's. The checks
run at most once a second per process (``CachedChecks``): anyone can ask for /ready, as often as they like.
"""

from __future__ import annotations

import logging

from flask import Blueprint
from flask import Flask
from flask import Response
from flask import current_app
from flask import jsonify

from tidal_api.metrics import on_metrics_port
from tidal_workers.health import LIVE
from tidal_workers.health import CachedChecks
from tidal_workers.health import Check
from tidal_workers.health import dependency_checks
from tidal_workers.health import readiness
from tidal_workers.runtime import Runtime

UNAVAILABLE = "unavailable"

bp = Blueprint("health", __name__)
log = logging.getLogger(__name__)


@bp.get("/health")
def health() -> tuple[Response, int]:
    status, body = LIVE
    return jsonify(body), status


def init_app(app: Flask, rt: Runtime) -> None:
    """The app's readiness checks, run at most once a second whatever the number of requests (CachedChecks)."""
    app.extensions["tidal_ready"] = CachedChecks(lambda: _logged(dependency_checks(rt)))
    app.register_blueprint(bp)


def _logged(checks: list[Check]) -> list[Check]:
    for check in checks:
        if not check.ok:
            log.warning("not ready: %s: %s", check.name, check.detail)
    return checks


@bp.get("/ready")
def ready() -> tuple[Response, int]:
    checks = current_app.extensions["tidal_ready"]()
    status, body = readiness(checks)
    if not on_metrics_port():
        body["checks"] = {c.name: "ok" if c.ok else UNAVAILABLE for c in checks}
    return jsonify(body), status
