"""``Idempotency-Key`` on ``POST /v1/files`` and ``POST /v1/batches``: a retried create gets the first object.

The key is stored beside the object it made, in the same transaction, with a digest of what the request asked
for. Within ``WINDOW_SECONDS`` the same key and the same request answer that object (its current state), a
different request under the key answers 409 ``idempotency_key_reused``; two racing requests with one key are
decided by the primary key of ``idempotency_keys``: the loser answers as a retry would. A request that fails
stores nothing, so it can be retried with the same key. Keys are per tenant and per route.

What "the same request" means: for a batch, the JSON body (key order and spacing aside); for an upload, the
purpose, the file name, ``expires_after`` and the SHA-256 of the bytes (a multipart body differs on every retry
by its boundary, so its raw bytes cannot be compared).
"""

from __future__ import annotations

import hashlib
import json
import time
import typing as t

from flask import request
from sqlalchemy import delete
from sqlalchemy.orm import Session

from tidal_api.errors import APIError
from tidal_workers.store import Store
from tidal_workers.store.models import IdempotencyKey

HEADER = "Idempotency-Key"
WINDOW_SECONDS = 24 * 3600
MAX_KEY = 255


def requested_key() -> str | None:
    """The request's key, or None; a malformed one is a 400 naming the header."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY or not key.isascii() or not key.isprintable():
        raise APIError(
            400,
            f"Invalid '{HEADER}' header: 1 to {MAX_KEY} printable ASCII characters.",
            param=HEADER,
            code="invalid_value",
        )
    return key


def digest(*parts: object) -> str:
    """A stable digest of what a request asked for (JSON of ``parts``, keys sorted)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class HashingReader:
    """A readable stream that hashes what passes through it (the upload's bytes, on their way to storage)."""

    def __init__(self, stream: t.IO[bytes]):
        self.stream = stream
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self.stream.read(size)
        self.sha256.update(chunk)
        return chunk


def earlier(session: Session, tenant: str, route: str, key: str, request_digest: str) -> str | None:
    """The id of the object an earlier request with this key made, or None; 409 if that request differed."""
    row = session.get(IdempotencyKey, (tenant, route, key))
    if row is None or row.created_at <= int(time.time()) - WINDOW_SECONDS:
        return None
    if row.request_hash != request_digest:
        raise APIError(
            409,
            f"This {HEADER} was used in the last 24 hours with a different request; it names only the request it "
            "was first sent with. Use a new key for a new request.",
            param=HEADER,
            code="idempotency_key_reused",
        )
    return row.object_id


def race_winner(store: Store, tenant: str, route: str, key: str | None, request_digest: str) -> str:
    """Called while handling an IntegrityError from a create: the id of the object made by the request that won this
    key (answer as its retry would); re-raises the error when no key took part or none was stored."""
    if key is None:
        raise  # the IntegrityError being handled
    with store.read() as s:
        first = earlier(s, tenant, route, key, request_digest)
    if first is None:
        raise
    return first


def record(session: Session, tenant: str, route: str, key: str, request_digest: str, object_id: str) -> None:
    """Store the key with the object it made, in the caller's transaction (flushed: a race fails here)."""
    now = int(time.time())
    session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.tenant_id == tenant,
            IdempotencyKey.route == route,
            IdempotencyKey.key == key,
            IdempotencyKey.created_at <= now - WINDOW_SECONDS,
        )
    )
    session.add(
        IdempotencyKey(
            tenant_id=tenant, route=route, key=key, request_hash=request_digest, object_id=object_id, created_at=now
        )
    )
    session.flush()
