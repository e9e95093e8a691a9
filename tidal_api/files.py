"""/v1/files: upload (the file part streamed straight to the blob storage, written once), list, retrieve, content,
delete."""

from __future__ import annotations

import dataclasses
import time
import typing as t

from flask import Blueprint
from flask import Response
from flask import jsonify
from flask import request
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from config import Settings
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
from tidal_api.limits import UploadRoom
from tidal_api.limits import upload_limit
from tidal_api.limits import upload_room
from tidal_api.multipart import Body
from tidal_api.multipart import Malformed
from tidal_api.multipart import drain
from tidal_api.pagination import can_name_a_row
from tidal_api.pagination import int_arg
from tidal_api.pagination import keyset_page
from tidal_api.pagination import list_body
from tidal_api.pagination import order_arg
from tidal_workers.blobs import Blobs
from tidal_workers.blobs import IterReader
from tidal_workers.blobs import TooLarge
from tidal_workers.blobs import Written
from tidal_workers.blobs import buffered
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


def _too_large(limit: int, purpose: str | None) -> APIError:
    for_purpose = f" for purpose '{purpose[:64]}'" if purpose in UPLOAD_PURPOSES else ""
    return APIError(413, f"File is too large: at most {limit} bytes{for_purpose}.", param="file", code="file_too_large")


def _over(settings: Settings, tenant: str, room: UploadRoom, purpose: str | None) -> APIError:
    """The answer to a file part past its limit: the tenant's storage quota if that was the tighter bound."""
    purpose_limit = upload_limit(settings, purpose or "")
    if room.free < purpose_limit:
        message = storage_message(settings, tenant, room.stored, room.free + 1)
        return APIError(400, message or "Storage limit reached.", param="file", code="storage_limit_exceeded")
    return _too_large(purpose_limit, purpose)


@dataclasses.dataclass
class _Received:
    fields: dict[str, str]
    written: Written | None = None
    filename: str | None = None
    sha256: str | None = None  # of the file's bytes, for the idempotency key


def _receive(
    stream: t.IO[bytes],
    boundary: str | None,
    blobs: Blobs,
    limit_for: t.Callable[[str | None], int],
    over: t.Callable[[str | None], APIError],
) -> _Received:
    """Read the form: its fields, and its `file` part written straight to storage under ``limit_for(purpose)``
    (the purpose's when that field came first, as the OpenAI SDK and curl send it; else the largest).

    A body that cannot be parsed reads as an empty form, as werkzeug's parser has it: the answer names the first
    missing parameter.
    """
    got = _Received(fields={})
    try:
        for part in Body(stream, boundary).parts():
            if part.filename is None:
                got.fields.setdefault(part.name, part.text())
            elif part.name == "file" and got.written is None:
                purpose = got.fields.get("purpose")
                hashing = idempotency.HashingReader(buffered(IterReader(part.chunks())))
                try:
                    got.written = blobs.write_stream(t.cast(t.IO[bytes], hashing), limit_for(purpose))
                except TooLarge:
                    raise over(purpose) from None
                got.filename, got.sha256 = part.filename, hashing.sha256.hexdigest()
    except BaseException as exc:
        if got.written is not None:
            blobs.delete(got.written.name)
        if isinstance(exc, Malformed):
            return _Received(fields={})
        raise
    return got


@bp.post("")
def upload() -> Response:
    if request.mimetype != "multipart/form-data":
        raise APIError(415, "Files must be uploaded as multipart/form-data.", code="unsupported_media_type")
    rt, settings, tenant = current_runtime(), current_runtime().settings, current_tenant()
    key = idempotency.requested_key()
    room = upload_room(rt, tenant)  # before the body is read: a Content-Length past the quota is refused here

    def limit_for(purpose: str | None) -> int:
        largest = upload_limit(settings, purpose) if purpose in UPLOAD_PURPOSES else settings.max_upload_bytes
        return min(largest, room.free)

    try:
        got = _receive(
            request.stream,
            request.mimetype_params.get("boundary"),
            rt.blobs,
            limit_for,
            lambda purpose: _over(settings, tenant, room, purpose),
        )
        drain(request.stream)  # after a body that could not be parsed, or its closing boundary: usually nothing
    except APIError:
        drain(request.stream)  # the client is still sending: read it out, so it gets this answer
        raise
    written = got.written
    try:
        purpose = got.fields.get("purpose")
        if not purpose:
            raise missing("purpose")
        if purpose not in UPLOAD_PURPOSES:
            raise invalid_value(
                "purpose",
                f"Invalid value for 'purpose': '{purpose[:64]}'. Supported values are: {', '.join(UPLOAD_PURPOSES)}.",
            )
        expires_after = expiry.from_form(got.fields, "expires_after")
        if written is None:
            raise missing("file")
        if written.bytes > limit_for(purpose):  # the file part came before `purpose`
            raise _over(settings, tenant, room, purpose)
        assert got.sha256 is not None
        return _store_upload(written, _clean_filename(got.filename), purpose, expires_after, key, got.sha256)
    except BaseException:
        if written is not None:
            rt.blobs.delete(written.name)  # refused, a retry answered with the first file, or a fault: no orphans
        raise


def _store_upload(
    written: Written, name: str, purpose: str, expires_after: int | None, key: str | None, content: str
) -> Response:
    """The File row for bytes already in storage, under the line limit, the storage quota and the idempotency key."""
    rt, settings, tenant = current_runtime(), current_runtime().settings, current_tenant()
    if purpose == "batch" and written.lines > settings.max_file_lines:
        raise APIError(
            400,
            f"A batch input file may hold at most {settings.max_file_lines} lines; this one has {written.lines}.",
            param="file",
            code="too_many_lines",
        )
    asked = idempotency.digest(purpose, name, expires_after, content)
    if key is not None:
        with rt.store.read() as s:
            first = idempotency.earlier(s, tenant, ROUTE, key, asked)
        if first is not None:
            raise _replay(first)
    now = int(time.time())
    try:
        with rt.store.transaction() as s:
            lock_tenant(s, tenant)  # concurrent uploads of one tenant are measured against its quota one by one
            stored = stored_bytes(s, tenant)
            if message := storage_message(settings, tenant, stored, written.bytes):
                raise APIError(400, message, param="file", code="storage_limit_exceeded")
            f = File(
                tenant_id=tenant,
                filename=name,
                purpose=purpose,
                bytes=written.bytes,
                lines=written.lines,
                created_at=now,
                expires_at=now + (expires_after or settings.file_expiry_seconds),
                status="processed",
                blob=written.name,
            )
            s.add(f)
            s.flush()
            if key is not None:
                idempotency.record(s, tenant, ROUTE, key, asked, f.id)
    except IntegrityError:  # the same key won a race: answer as its retry
        raise _replay(idempotency.race_winner(rt.store, tenant, ROUTE, key, asked)) from None
    return jsonify(serialize.file_object(f))


class _Replay(Exception):
    """The upload repeats an earlier one (same Idempotency-Key, same request): answer with that file."""

    def __init__(self, file: dict[str, t.Any]):
        super().__init__(file["id"])
        self.file = file


def _replay(file_id: str) -> _Replay:
    """A retried upload's answer: the file the first request made, as it stands, if it is still there.

    A file deleted (or expired) since is a 409, not a new upload: the key names one request and the one object it
    made, and a client that deleted that object is better told than handed a second file under the same key.
    """
    with current_runtime().store.read() as s:
        f = s.get(File, file_id)
        if f is None or f.deleted or f.tenant_id != current_tenant():
            raise APIError(
                409,
                f"The file this {idempotency.HEADER} made in the last 24 hours ({file_id}) has been deleted or has "
                "expired; a retry cannot bring it back. Upload it again under a new key.",
                param=idempotency.HEADER,
                code="idempotency_key_file_deleted",
            )
        return _Replay(serialize.file_object(f))


@bp.errorhandler(_Replay)
def _replayed(exc: _Replay) -> Response:
    return jsonify(exc.file)


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
