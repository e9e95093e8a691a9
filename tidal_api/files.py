"""/v1/files: upload (the file part streamed straight to the blob storage, written once), list, retrieve, content,
delete."""

from __future__ import annotations

import time
import typing as t

from flask import Blueprint
from flask import Response
from flask import jsonify
from flask import request
from sqlalchemy import select
from sqlalchemy.orm import Session

from config import Settings
from tidal_api import serialize
from tidal_api.auth import authenticate
from tidal_api.auth import current_tenant
from tidal_api.context import current_runtime
from tidal_api.errors import APIError
from tidal_api.errors import file_not_found
from tidal_api.errors import invalid_value
from tidal_api.errors import missing
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
from tidal_workers.store.models import File

UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
PURPOSES = UPLOAD_PURPOSES + ("assistants_output", "batch_output", "fine-tune-results")  # incl. files Tidal writes
MAX_FILENAME = 512  # files.filename

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


def upload_limit(settings: Settings, purpose: str | None) -> int:
    """The largest upload ``purpose`` accepts (the largest of all when the purpose is not known yet)."""
    if purpose == "batch":
        return min(settings.max_upload_bytes, settings.max_file_bytes)
    return settings.max_upload_bytes


def _too_large(limit: int, purpose: str | None) -> APIError:
    for_purpose = f" for purpose '{purpose[:64]}'" if purpose in UPLOAD_PURPOSES else ""
    return APIError(413, f"File is too large: at most {limit} bytes{for_purpose}.", param="file", code="file_too_large")


def _receive(
    stream: t.IO[bytes], boundary: str | None, blobs: Blobs, settings: Settings
) -> tuple[dict[str, str], Written | None, str | None]:
    """Read the form: its fields, and its `file` part written straight to storage (under the limit of the
    purpose when that field came first, as the OpenAI SDK and curl send it; else under the largest).

    A body that cannot be parsed reads as an empty form, as werkzeug's parser has it: the answer names the first
    missing parameter.
    """
    fields: dict[str, str] = {}
    written, filename = None, None
    try:
        for part in Body(stream, boundary).parts():
            if part.filename is None:
                fields.setdefault(part.name, part.text())
            elif part.name == "file" and written is None:
                limit = upload_limit(settings, fields.get("purpose"))
                try:
                    written = blobs.write_stream(buffered(IterReader(part.chunks())), limit)
                except TooLarge:
                    raise _too_large(limit, fields.get("purpose")) from None
                filename = part.filename
    except BaseException as exc:
        if written is not None:
            blobs.delete(written.name)
        if isinstance(exc, Malformed):
            return {}, None, None
        raise
    return fields, written, filename


@bp.post("")
def upload() -> Response:
    if request.mimetype != "multipart/form-data":
        raise APIError(415, "Files must be uploaded as multipart/form-data.", code="unsupported_media_type")
    rt, settings = current_runtime(), current_runtime().settings
    try:
        fields, written, filename = _receive(
            request.stream, request.mimetype_params.get("boundary"), rt.blobs, settings
        )
        drain(request.stream)  # after a body that could not be parsed, or its closing boundary: usually nothing
    except APIError:
        drain(request.stream)  # the client is still sending: read it out, so it gets this answer
        raise
    try:
        purpose = fields.get("purpose")
        if not purpose:
            raise missing("purpose")
        if purpose not in UPLOAD_PURPOSES:
            raise invalid_value(
                "purpose",
                f"Invalid value for 'purpose': '{purpose[:64]}'. Supported values are: {', '.join(UPLOAD_PURPOSES)}.",
            )
        if written is None:
            raise missing("file")
        if written.bytes > (limit := upload_limit(settings, purpose)):  # the file part came before `purpose`
            raise _too_large(limit, purpose)
        if purpose == "batch" and written.lines > settings.max_file_lines:
            raise APIError(
                400,
                f"A batch input file may hold at most {settings.max_file_lines} lines; this one has {written.lines}.",
                param="file",
                code="too_many_lines",
            )
        now = int(time.time())
        with rt.store.transaction() as s:
            f = File(
                tenant_id=current_tenant(),
                filename=_clean_filename(filename),
                purpose=purpose,
                bytes=written.bytes,
                lines=written.lines,
                created_at=now,
                expires_at=now + settings.file_expiry_seconds,
                status="processed",
                blob=written.name,
            )
            s.add(f)
    except BaseException:
        if written is not None:
            rt.blobs.delete(written.name)
        raise
    return jsonify(serialize.file_object(f))


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
    rt = current_runtime()
    with rt.store.transaction() as s:
        f = owned_file(s, file_id)
        f.deleted = True
    rt.blobs.delete(f.blob)
    return jsonify(serialize.file_deleted(f.id))
