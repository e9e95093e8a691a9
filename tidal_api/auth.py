"""`Authorization: Bearer <key>` -> the key's tenant, kept in ``g.tenant`` for the request.

Keys are stored as SHA-256 digests, so the lookup compares digests, never the
secret itself: a timing difference can reveal at most a prefix of a digest,
which says nothing about the key.
"""

from __future__ import annotations

import typing as t

from flask import g
from flask import request

from tidal_api.context import current_runtime
from tidal_api.errors import APIError
from tidal_workers.store import api_keys

DEV_KEY = "tidal-dev-key"
_MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


def authenticate() -> None:
    """A ``before_request`` hook for the /v1 blueprints."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise APIError(401, _MISSING, code="missing_api_key")
    rt = current_runtime()
    tenant = api_keys.tenant_for_key(rt.store, key)
    # The store may be shared with a dev-mode process that wrote the dev key back; production still refuses it.
    # (A plain == is fine here: the dev key is public.)
    if tenant is None or (key == DEV_KEY and rt.settings.env != "dev"):
        raise APIError(401, f"Incorrect API key provided: {_redact(key)}.", code="invalid_api_key")
    g.tenant = tenant


def current_tenant() -> str:
    return t.cast(str, g.tenant)


def _redact(key: str) -> str:
    return key[:3] + "*" * 4 + key[-4:] if len(key) > 8 else "*" * len(key)
