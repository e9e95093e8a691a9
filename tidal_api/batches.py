"""/v1/batches: create (validated inline or by a Celery task), retrieve, cancel, list."""

from __future__ import annotations

import json
import time
import typing as t

import redis
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
from tidal_api.errors import batch_not_found
from tidal_api.errors import invalid_type
from tidal_api.errors import invalid_value
from tidal_api.errors import missing
from tidal_api.files import owned_file
from tidal_api.limits import read_json_body
from tidal_api.pagination import can_name_a_row
from tidal_api.pagination import int_arg
from tidal_api.pagination import keyset_page
from tidal_api.pagination import list_body
from tidal_workers.cancel import cancel_batch
from tidal_workers.ingest import TokenFloor
from tidal_workers.ingest import ingest_batch
from tidal_workers.ingest import request_ingest
from tidal_workers.ingest import token_error
from tidal_workers.ingest import token_floor
from tidal_workers.policy.phase import ALWAYS
from tidal_workers.policy.phase import AUTO
from tidal_workers.policy.phase import NEVER
from tidal_workers.policy.phase import SPLIT_MODES
from tidal_workers.quotas import batch_storage_message
from tidal_workers.quotas import lock_tenant
from tidal_workers.quotas import open_batch_message
from tidal_workers.quotas import token_limit_message
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File

ENDPOINTS = ("/v1/responses", "/v1/chat/completions", "/v1/completions", "/v1/embeddings")
COMPLETION_WINDOWS = ("24h",)
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
NOT_CANCELLABLE = (BatchStatus.completed.value, BatchStatus.failed.value, BatchStatus.expired.value)
ALREADY_CANCELLED = (BatchStatus.cancelling.value, BatchStatus.cancelled.value)
ROUTE = "batches"  # the idempotency keys' namespace

bp = Blueprint("batches", __name__, url_prefix="/v1/batches")
bp.before_request(authenticate)


def _owned_batch(session: Session, batch_id: str) -> Batch:
    b = session.get(Batch, batch_id) if can_name_a_row(batch_id) else None
    if b is None or b.tenant_id != current_tenant():
        raise batch_not_found(batch_id)
    return b


def _json_body() -> dict[str, t.Any]:
    read_json_body()
    try:
        body = request.get_json(force=True, silent=True)
    except RecursionError:  # nesting deeper than the parser's stack; not caught by silent=True
        body = None
    if not isinstance(body, dict):
        raise APIError(
            400,
            "We could not parse the JSON body of your request. The body must be a JSON object.",
            code="invalid_json",
        )
    try:  # a lone surrogate (``"\\ud800"``) is valid JSON but no UTF-8 string: PostgreSQL refuses it
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400,
            "The JSON body holds a lone UTF-16 surrogate escape (such as \\ud800): strings must be valid Unicode.",
            code="invalid_json",
        ) from None
    return body


def _required_str(body: dict[str, t.Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        raise missing(name)
    if not isinstance(value, str):
        raise invalid_type(name, "a string")
    return value


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_type("metadata", "an object of string keys and string values")
    if len(value) > MAX_METADATA_PAIRS:
        raise invalid_value("metadata", f"Invalid 'metadata': at most {MAX_METADATA_PAIRS} key-value pairs.")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise invalid_value("metadata", f"Invalid 'metadata': keys are at most {MAX_METADATA_KEY} characters.")
        if not isinstance(item, str):
            raise invalid_type(f"metadata.{key}", "a string")
        if len(item) > MAX_METADATA_VALUE:
            raise invalid_value(
                f"metadata.{key}", f"Invalid 'metadata': values are at most {MAX_METADATA_VALUE} characters."
            )
    return value


def _extension(value: object, always_allowed: bool) -> dict[str, str]:
    """Tidal's own create options, under ``tidal`` (OpenAI's SDKs send it as ``extra_body``).

    ``phase_split: always`` makes every item freeze its prompt's KV on shared storage, so the operator allows it
    (``TIDAL_PHASE_SPLIT_ALWAYS``), not the tenant."""
    if value is None:
        return {"phase_split": AUTO}
    if not isinstance(value, dict):
        raise invalid_type("tidal", "an object")
    if unknown := sorted(set(value) - {"phase_split"}):
        raise invalid_value(f"tidal.{unknown[0][:64]}", f"Unknown parameter: 'tidal.{unknown[0][:64]}'.")
    mode = value.get("phase_split", AUTO)
    if not isinstance(mode, str):
        raise invalid_type("tidal.phase_split", "a string")
    if mode not in SPLIT_MODES:
        raise invalid_value(
            "tidal.phase_split",
            f"Invalid value for 'tidal.phase_split': '{mode[:64]}'. Supported values are: {', '.join(SPLIT_MODES)}.",
        )
    if mode == ALWAYS and not always_allowed:
        raise invalid_value(
            "tidal.phase_split",
            "Invalid value for 'tidal.phase_split': 'always' is not enabled on this deployment "
            f"(TIDAL_PHASE_SPLIT_ALWAYS). Supported values are: {AUTO}, {NEVER}.",
        )
    return {"phase_split": mode}


def _served(rt: Runtime) -> frozenset[str] | None:
    """The models live nodes serve, for the ``tidal`` extension; None when Redis cannot say (the answer still comes)."""
    try:
        return frozenset(rt.queue.served_models())
    except redis.RedisError:
        return None


def _batch_answer(batch_id: str) -> Response:
    rt = current_runtime()
    with rt.store.read() as s:
        return jsonify(serialize.batch_object(s.get_one(Batch, batch_id), rt.settings, _served(rt)))


@bp.post("")
def create() -> Response:
    key = idempotency.requested_key()
    body = _json_body()
    input_file_id = _required_str(body, "input_file_id")
    endpoint = _required_str(body, "endpoint")
    if endpoint not in ENDPOINTS:
        raise invalid_value(
            "endpoint",
            f"Invalid value for 'endpoint': '{endpoint[:64]}'. Supported values are: {', '.join(ENDPOINTS)}.",
        )
    window = _required_str(body, "completion_window")
    if window not in COMPLETION_WINDOWS:
        raise invalid_value(
            "completion_window", f"Invalid value for 'completion_window': '{window[:64]}'. Supported values are: '24h'."
        )
    metadata = _metadata(body.get("metadata"))
    output_expires_after = expiry.from_json(body.get("output_expires_after"), "output_expires_after")
    rt, tenant = current_runtime(), current_tenant()
    options = _extension(body.get("tidal"), rt.settings.phase_split_always)
    asked = idempotency.digest(body)
    if key is not None:
        with rt.store.read() as s:
            first = idempotency.earlier(s, tenant, ROUTE, key, asked)
        if first is not None:  # a retry: the batch the first request made, as it stands now
            return _batch_answer(first)
    with rt.store.read() as s:
        source = _input_file(s, input_file_id)
        inline = source.bytes <= rt.settings.sync_validate_bytes
        blob = source.blob
    # A large file's first lines, read before any lock is taken: a sure refusal by the token quota costs no ingest.
    floor = None if inline else token_floor(rt, blob, endpoint)
    now = int(time.time())
    try:
        with rt.store.transaction() as s:
            lock_tenant(s, tenant)  # the open-batch count, the quotas and the new row in one decision
            if message := open_batch_message(s, rt.settings, tenant):
                raise APIError(429, message, code="batch_limit_exceeded")
            if message := batch_storage_message(s, rt.settings, tenant):
                raise APIError(400, message, code="storage_limit_exceeded")
            if not inline and (validating := _validating_on(s, tenant, input_file_id)):
                raise APIError(
                    409,
                    f"File {input_file_id} is still being validated for batch {validating}. Create another batch on "
                    "it once that one has left 'validating'.",
                    param="input_file_id",
                    code="input_file_in_use",
                )
            refusal = _token_refusal(s, rt.settings, tenant, floor, now) if floor else {}
            batch = Batch(
                tenant_id=tenant,
                endpoint=endpoint,
                input_file_id=input_file_id,
                completion_window=window,
                metadata_=metadata,
                created_at=now,
                expires_at=now + rt.settings.completion_window_seconds,
                output_expires_after=output_expires_after,
                phase_split=options["phase_split"],
                **refusal,
            )
            s.add(batch)
            s.flush()
            if key is not None:
                idempotency.record(s, tenant, ROUTE, key, asked, batch.id)
    except IntegrityError:  # the same key won a race: answer as its retry
        return _batch_answer(idempotency.race_winner(rt.store, tenant, ROUTE, key, asked))
    if inline:
        ingest_batch(rt, batch.id)
    elif not refusal:
        request_ingest(rt, batch.id)  # a broker that is down leaves the batch `validating`, and reconcile resends
    return _batch_answer(batch.id)


def _input_file(session: Session, input_file_id: str) -> File:
    source = owned_file(session, input_file_id, param="input_file_id")
    if source.purpose != "batch":
        raise invalid_value(
            "input_file_id",
            f"File {input_file_id} has purpose '{source.purpose}'; a batch input file must have purpose 'batch'.",
        )
    return source


def _token_refusal(session: Session, settings: Settings, tenant: str, floor: TokenFloor, now: int) -> dict[str, t.Any]:
    """A new batch's failed state when its file's first lines alone are over the tenant's enqueued-token quota,
    as its ingest would fail it (OpenAI's ``token_limit_exceeded``); {} when they are not."""
    over = token_limit_message(session, settings, tenant, floor.model, floor.tokens)
    if over is None:
        return {}
    return {"status": BatchStatus.failed.value, "failed_at": now, "model": floor.model, "errors": [token_error(over)]}


def _validating_on(session: Session, tenant: str, input_file_id: str) -> str | None:
    """A batch of the tenant still validating the large file ``input_file_id``: a second would validate it again
    beside it (100 batches on one 200 MB file, 100 ingests), so it is refused until the first has left
    `validating`; then another may be created, as OpenAI allows several batches on one file."""
    return session.scalar(
        select(Batch.id)
        .where(
            Batch.tenant_id == tenant,
            Batch.input_file_id == input_file_id,
            Batch.status == BatchStatus.validating.value,
        )
        .limit(1)
    )


@bp.get("/<path:batch_id>")
def retrieve(batch_id: str) -> Response:
    rt = current_runtime()
    with rt.store.read() as s:
        return jsonify(serialize.batch_object(_owned_batch(s, batch_id), rt.settings, _served(rt)))


@bp.post("/<path:batch_id>/cancel")
def cancel(batch_id: str) -> Response:
    rt = current_runtime()
    with rt.store.read() as s:
        status = _owned_batch(s, batch_id).status
    if status in NOT_CANCELLABLE:
        raise APIError(409, f"Cannot cancel a batch with status '{status}'.", code="batch_not_cancellable")
    if status not in ALREADY_CANCELLED:
        cancel_batch(rt, batch_id)
    with rt.store.read() as s:
        return jsonify(serialize.batch_object(s.get_one(Batch, batch_id), rt.settings, _served(rt)))


@bp.get("")
def list_batches() -> Response:
    limit = int_arg(request.args, "limit", 20, 1, 100)
    after = request.args.get("after")
    stmt = select(Batch).where(Batch.tenant_id == current_tenant())
    with current_runtime().store.read() as s:
        rows, has_more = keyset_page(
            s,
            stmt,
            Batch,
            tenant=current_tenant(),
            after=after,
            limit=limit,
            order="desc",
            not_found=batch_not_found(after or "", "after"),
        )
    rt = current_runtime()
    served = _served(rt) if any(b.status == BatchStatus.in_progress.value for b in rows) else None
    return jsonify(list_body([serialize.batch_object(b, rt.settings, served) for b in rows], has_more))
