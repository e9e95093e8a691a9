"""Request sizes, bounded before a byte of the body is read.

- Every route but the upload takes at most ``JSON_BODY_LIMIT`` (64 KB): a larger ``Content-Length`` answers 413
  ``request_too_large`` at once, and a body without one (chunked) is cut off there as it is read.
- ``POST /v1/files`` is bounded by its purpose's limit and by the tenant's stored-bytes quota:
  ``upload_room`` answers before the multipart body is parsed when ``Content-Length`` already says it cannot fit,
  and gives the byte limit the copy to storage enforces as it streams (``TooLarge``).
"""

from __future__ import annotations

import dataclasses

from flask import Flask
from flask import request
from werkzeug.exceptions import RequestEntityTooLarge

from config import Settings
from tidal_api.errors import APIError
from tidal_workers.quotas import storage_message
from tidal_workers.quotas import stored_bytes
from tidal_workers.runtime import Runtime

JSON_BODY_LIMIT = 64 * 1024
#: Room for multipart boundaries and the form fields around the file.
MULTIPART_OVERHEAD = 64 * 1024
UPLOAD_ENDPOINT = "files.upload"


def too_large(limit: int, what: str) -> APIError:
    return APIError(413, f"Request body is too large: at most {limit} bytes for {what}.", code="request_too_large")


def upload_limit(settings: Settings, purpose: str) -> int:
    """The largest file ``purpose`` accepts, in bytes."""
    return min(settings.max_upload_bytes, settings.max_file_bytes) if purpose == "batch" else settings.max_upload_bytes


@dataclasses.dataclass(frozen=True)
class UploadRoom:
    stored: int  # the tenant's live bytes now
    free: int  # what its stored-bytes quota has left


def upload_room(rt: Runtime, tenant: str) -> UploadRoom:
    """The tenant's room for an upload; refused now (400) if the quota is spent or ``Content-Length`` exceeds it."""
    with rt.store.read() as s:
        stored = stored_bytes(s, tenant)
    free = rt.settings.limits_for(tenant).stored_bytes - stored
    declared = max(0, (request.content_length or 0) - MULTIPART_OVERHEAD)
    if free <= 0 or declared > free:
        message = storage_message(rt.settings, tenant, stored, max(declared, 1))
        raise APIError(400, message or "Storage limit reached.", param="file", code="storage_limit_exceeded")
    return UploadRoom(stored, free)


def _bound_json_bodies() -> None:
    if request.endpoint == UPLOAD_ENDPOINT:
        return
    if (request.content_length or 0) > JSON_BODY_LIMIT:
        raise too_large(JSON_BODY_LIMIT, "this endpoint")
    # A body without Content-Length (chunked) stops being read one byte past the limit: ``read_json_body`` sees
    # that byte and refuses the body, rather than parsing a truncated one.
    request.max_content_length = JSON_BODY_LIMIT + 1


def read_json_body() -> bytes:
    """The request's body, at most JSON_BODY_LIMIT bytes (413 beyond, however it was sent)."""
    try:
        data = request.get_data()  # cached: get_json parses these bytes
    except RequestEntityTooLarge:
        raise too_large(JSON_BODY_LIMIT, "this endpoint") from None
    if len(data) > JSON_BODY_LIMIT:
        raise too_large(JSON_BODY_LIMIT, "this endpoint")
    return data


def init_app(app: Flask) -> None:
    app.before_request(_bound_json_bodies)
