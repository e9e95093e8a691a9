"""What a request reaches: the Runtime of the app serving it (``create_app`` keeps it in ``app.extensions``)."""

from __future__ import annotations

import typing as t

from flask import current_app

from tidal_workers.runtime import Runtime


def current_runtime() -> Runtime:
    return t.cast(Runtime, current_app.extensions["tidal"])
