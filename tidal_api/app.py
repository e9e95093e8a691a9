"""The Flask app factory: one Runtime per app, /v1/files and /v1/batches, OpenAI errors, /metrics, /health, /ready."""

from __future__ import annotations

import logging
import typing as t

from flask import Flask
from flask.json.provider import DefaultJSONProvider

from config import Settings
from config import load_settings
from tidal_workers.blobs.sentinel import prepare_storage
from tidal_workers.runtime import Runtime
from tidal_workers.store import api_keys

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, runtime: Runtime | None = None) -> Flask:
    """Build the API. Given a runtime (tests, embedding) it is used as is; else one is built and prepared."""
    if runtime is None:
        runtime = Runtime(settings or load_settings())
        runtime.store.migrate()
        api_keys.sync(runtime.store)
        # Refuses to serve on storage the workers cannot see.
        prepare_storage(runtime.blobs, runtime.redis, "api", runtime.settings.node)
        # gunicorn preloads the app and then forks: no worker may inherit the master's pooled connections.
        runtime.store.engine.dispose()
        del runtime.blobs  # nor its storage client's: each process opens its own

    from tidal_api import batches
    from tidal_api import errors
    from tidal_api import files
    from tidal_api import health
    from tidal_api import limits
    from tidal_api import metrics
    from tidal_api import openapi

    warn_if_any_model_goes(runtime.settings)
    app = Flask(__name__)
    # Past this werkzeug answers 413 before reading the body; below it an upload streams to storage (multipart.py).
    app.config["MAX_CONTENT_LENGTH"] = runtime.settings.max_upload_bytes + limits.MULTIPART_OVERHEAD
    t.cast(DefaultJSONProvider, app.json).sort_keys = False  # keep OpenAI's field order on the wire
    app.extensions["tidal"] = runtime
    errors.init_app(app)
    limits.init_app(app)  # every body but an upload's: 64 KB
    metrics.init_app(app)  # GET /metrics and the request-latency histogram
    health.init_app(app, runtime)  # /health, and /ready from checks at most a second old
    for blueprint in (files.bp, batches.bp, openapi.bp):
        app.register_blueprint(blueprint)
    return app


def warn_if_any_model_goes(settings: Settings) -> None:
    """Outside dev mode, say at start that an empty TIDAL_MODELS lets a batch name any model: every name the engine
    answers to (a `--served-model-name` alias, a LoRA adapter a resolver loads by name) is then a model of its own,
    with its own per-model token quota."""
    if settings.env != "dev" and not settings.model_list:
        log.warning(
            "TIDAL_MODELS is empty: a batch may name any model, and each name the engine answers to (an alias, a "
            "LoRA adapter loaded by name) counts against its own per-model token quota; list the models to serve."
        )
