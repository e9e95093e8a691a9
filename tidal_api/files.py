"""/v1/files: upload (streamed to the blob storage), list, retrieve, content, delete."""

from __future__ import annotations

import time
import typing as t

from flask import Blueprint
from flask import Response
from flask import jsonify
from flask import request
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tidal_api import expiry
from tidal_api import idempotency
from tidal_api import serialize
from tidal_api.auth import authenticate
from tidal_api.auth import current_tenant
from tidal_api.context import current_runtime
from tidal_api.errors import APIError
from tidal_api.errors import file_not_found
from tidal_api.errors import invalid_value
from tidal_api.errors import missing
from tidal_api.limits import upload_limit
from tidal_api.limits import upload_room
from tidal_api.pagination import can_name_a_row
from tidal_api.pagination import int_arg
from tidal_api.pagination import keyset_page
from tidal_api.pagination import list_body
from tidal_api.pagination import order_arg
from tidal_workers.blobs import TooLarge
from tidal_workers.quotas import lock_tenant
from tidal_workers.quotas import storage_message
from tidal_workers.quotas import stored_bytes
from tidal_workers.retention import purge_contents
from tidal_workers.store.models import File

UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
PURPOSES = UPLOAD_PURPOSES + ("assistants_output", "batch_output", "fine-tune-results")  # incl. files Tidal writes
MAX_FILENAME = 512  # files.filename
ROUTE = "files"  # the idempotency keys' namespace

bp = Blueprint("files", __name__, url_prefix="/v1/files")
bp.before_request(authenticate)


def owned_file(session: Session, file_id: str, param: str = "file_id") -> File:
    """The caller's live file, or the same 404 whatever the reason (unknown, deleted, not theirs)."""
    f = session.get(File, file_id) if can_name_a_row(file_id) else None
    if f is None or f.deleted or f.tenant_id != current_tenant():
        raise file_not_found(file_id, param)
    return f


def _clean_filename(name: str | None) -> str:
    """A display name every database can store: no NUL, no lone surrogate, bounded."""
    name = (name or "upload").replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return name[:MAX_FILENAME] or "upload"


def _file_answer(file_id: str) -> Response:
    """A file object by id (a retried upload's answer: the file the first request made)."""
    with current_runtime().store.read() as s:
        f = s.get(File, file_id)
        if f is None or f.tenant_id != current_tenant():
            raise file_not_found(file_id)
        return jsonify(serialize.file_object(f))


@bp.post("")
def upload() -> Response:
    if request.mimetype != "multipart/form-data":
        raise APIError(415, "Files must be uploaded as multipart/form-data.", code="unsupported_media_type")
    rt, settings, tenant = current_runtime(), current_runtime().settings, current_tenant()
    key = idempotency.requested_key()
    room = upload_room(rt, tenant)  # before the body is read: a Content-Length past the quota is refused here
    # request.files spools each part to a temporary file; the limit below is enforced while copying it.
    purpose = request.form.get("purpose")
    if not purpose:
        raise missing("purpose")
    if purpose not in UPLOAD_PURPOSES:
        raise invalid_value(
            "purpose",
            f"Invalid value for 'purpose': '{purpose[:64]}'. Supported values are: {', '.join(UPLOAD_PURPOSES)}.",
        )
    expires_after = expiry.from_form(request.form, "expires_after")
    upload_ = request.files.get("file")
    if upload_ is None:
        raise missing("file")
    purpose_limit = upload_limit(settings, purpose)
    limit = min(purpose_limit, room.free)
    stream = idempotency.HashingReader(upload_.stream)
    try:
        blob, size, lines = rt.blobs.write_stream(t.cast(t.IO[bytes], stream), limit)
    except TooLarge:
        if limit < purpose_limit:
            message = storage_message(settings, tenant, room.stored, limit + 1)
            raise APIError(400, message or "", param="file", code="storage_limit_exceeded") from None
        raise APIError(
            413,
            f"File is too large: at most {limit} bytes for purpose '{purpose}'.",
            param="file",
            code="file_too_large",
        ) from None
    try:
        return _store_upload(blob, size, lines, purpose, expires_after, key, stream.sha256.hexdigest())
    except BaseException:
        rt.blobs.delete(blob)  # refused, a retry answered with the first file, or a fault: no orphan bytes
        raise


def _store_upload(
    blob: str, size: int, lines: int, purpose: str, expires_after: int | None, key: str | None, content: str
) -> Response:
    """The File row for bytes already in storage, under the line limit, the storage quota and the idempotency key."""
    rt, settings, tenant = current_runtime(), current_runtime().settings, current_tenant()
    if purpose == "batch" and lines > settings.max_file_lines:
        raise APIError(
            400,
            f"A batch input file may hold at most {settings.max_file_lines} lines; this one has {lines}.",
            param="file",
            code="too_many_lines",
        )
    name = _clean_filename(request.files["file"].filename)
    asked = idempotency.digest(purpose, name, expires_after, content)
    if key is not None:
        with rt.store.read() as s:
            first = idempotency.earlier(s, tenant, ROUTE, key, asked)
        if first is not None:
            raise _Replay(first)
    now = int(time.time())
    try:
        with rt.store.transaction() as s:
            lock_tenant(s, tenant)  # concurrent uploads of one tenant are measured against its quota one by one
            stored = stored_bytes(s, tenant)
            if message := storage_message(settings, tenant, stored, size):
                raise APIError(400, message, param="file", code="storage_limit_exceeded")
            f = File(
                tenant_id=tenant,
                filename=name,
                purpose=purpose,
                bytes=size,
                lines=lines,
                created_at=now,
                expires_at=now + (expires_after or settings.file_expiry_seconds),
                status="processed",
                blob=blob,
            )
            s.add(f)
            s.flush()
            if key is not None:
                idempotency.record(s, tenant, ROUTE, key, asked, f.id)
    except IntegrityError:  # the same key won a race: answer as its retry
        raise _Replay(idempotency.race_winner(rt.store, tenant, ROUTE, key, asked)) from None
    return jsonify(serialize.file_object(f))


class _Replay(Exception):
    """The upload repeats an earlier one (same Idempotency-Key, same request): answer with that file."""

    def __init__(self, file_id: str):
        super().__init__(file_id)
        self.file_id = file_id


@bp.errorhandler(_Replay)
def _replayed(exc: _Replay) -> Response:
    return _file_answer(exc.file_id)


@bp.get("")
def list_files() -> Response:
    limit = int_arg(request.args, "limit", 10_000, 1, 10_000)
    order = order_arg(request.args)
    stmt = select(File).where(File.tenant_id == current_tenant(), File.deleted.is_(False))
    if purpose := request.args.get("purpose"):
        if purpose not in PURPOSES:
            raise invalid_value("purpose", f"Invalid value for 'purpose': '{purpose[:64]}'.")
        stmt = stmt.where(File.purpose == purpose)
    after = request.args.get("after")
    with current_runtime().store.read() as s:
        rows, has_more = keyset_page(
            s,
            stmt,
            File,
            tenant=current_tenant(),
            after=after,
            limit=limit,
            order=order,
            not_found=file_not_found(after or "", "after"),
        )
    return jsonify(list_body([serialize.file_object(f) for f in rows], has_more))


@bp.get("/<path:file_id>")
def retrieve(file_id: str) -> Response:
    with current_runtime().store.read() as s:
        return jsonify(serialize.file_object(owned_file(s, file_id)))


@bp.get("/<path:file_id>/content")
def content(file_id: str) -> Response:
    with current_runtime().store.read() as s:
        f = owned_file(s, file_id)
    return Response(
        current_runtime().blobs.iter_chunks(f.blob),
        mimetype="application/octet-stream",
        headers={"Content-Length": str(f.bytes)},
    )


@bp.delete("/<path:file_id>")
def delete(file_id: str) -> Response:
    """The bytes go, and the prompts or responses items hold of them; the row stays as a tombstone (for cursors)
    until the file's expiry."""
    rt = current_runtime()
    with rt.store.transaction() as s:
        f = owned_file(s, file_id)
        f.deleted = True
        purge_contents(s, f)
    rt.blobs.delete(f.blob)
    return jsonify(serialize.file_deleted(f.id))
