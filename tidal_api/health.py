"""GET /health (liveness) and GET /ready (SQL, Redis and file storage answer), without a key, for healthchecks."""

from __future__ import annotations

from flask import Blueprint
from flask import Response
from flask import current_app
from flask import jsonify

from tidal_workers.health import LIVE
from tidal_workers.health import dependency_checks
from tidal_workers.health import readiness

bp = Blueprint("health", __name__)


@bp.get("/health")
def health() -> tuple[Response, int]:
    status, body = LIVE
    return jsonify(body), status


@bp.get("/ready")
def ready() -> tuple[Response, int]:
    status, body = readiness(dependency_checks(current_app.extensions["tidal"]))
    return jsonify(body), status
