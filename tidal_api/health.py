"""GET /health (liveness) and GET /ready (SQL, Redis and file storage answer), without a key, for healthchecks.

The public port's /ready says which check failed but not why: a reason can name internal hosts, ports and
paths. The reason is logged, and shown on the metrics port (``TIDAL_METRICS_BIND``) and the worker's.
"""

from __future__ import annotations

import logging

from flask import Blueprint
from flask import Response
from flask import current_app
from flask import jsonify

from tidal_api.metrics import on_metrics_port
from tidal_workers.health import LIVE
from tidal_workers.health import dependency_checks
from tidal_workers.health import readiness

UNAVAILABLE = "unavailable"

bp = Blueprint("health", __name__)
log = logging.getLogger(__name__)


@bp.get("/health")
def health() -> tuple[Response, int]:
    status, body = LIVE
    return jsonify(body), status


@bp.get("/ready")
def ready() -> tuple[Response, int]:
    checks = dependency_checks(current_app.extensions["tidal"])
    status, body = readiness(checks)
    for check in checks:
        if not check.ok:
            log.warning("not ready: %s: %s", check.name, check.detail)
    if not on_metrics_port():
        body["checks"] = {c.name: "ok" if c.ok else UNAVAILABLE for c in checks}
    return jsonify(body), status
