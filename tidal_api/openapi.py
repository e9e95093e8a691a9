"""The OpenAPI 3.1 document of this API, served at GET /openapi.json.

Written by hand next to the views it describes; tests/api/test_openapi.py calls
every documented operation on a live server, expects each documented status and
validates each body against the schema here, so the two cannot drift apart.
"""

from __future__ import annotations

import typing as t

from flask import Blueprint
from flask import Response
from flask import jsonify

from tidal_api.batches import ENDPOINTS
from tidal_api.files import PURPOSES
from tidal_api.files import UPLOAD_PURPOSES
from tidal_workers.policy.phase import SPLIT_MODES

bp = Blueprint("openapi", __name__)


def _obj(properties: dict[str, t.Any], **extra: t.Any) -> dict:
    """A closed object whose every property is required (the wire always sends each field, maybe null)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


INT, STR, BOOL = {"type": "integer"}, {"type": "string"}, {"type": "boolean"}
INT_OR_NULL, STR_OR_NULL = {"type": ["integer", "null"]}, {"type": ["string", "null"]}
NUM, NUM_OR_NULL = {"type": "number"}, {"type": ["number", "null"]}

BATCH_STATUSES = [
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]

SCHEMAS: dict[str, t.Any] = {
    "Error": _obj({"error": _obj({"message": STR, "type": STR, "param": STR_OR_NULL, "code": STR_OR_NULL})}),
    "Health": _obj({"status": {"const": "ok"}}),
    "Readiness": _obj(
        {
            "status": {"enum": ["ready", "not_ready"]},
            "checks": _obj(
                dict.fromkeys(("sql", "redis", "storage"), STR),
                description="`ok`, or `unavailable` (the reason is logged, and shown on the metrics port).",
            ),
        }
    ),
    "File": _obj(
        {
            "id": STR,
            "object": {"const": "file"},
            "bytes": INT,
            "created_at": INT,
            "expires_at": INT_OR_NULL,
            "filename": STR,
            "purpose": STR,
            "status": {"enum": ["uploaded", "processed", "error"]},
            "status_details": STR_OR_NULL,
        }
    ),
    "FileDeleted": _obj({"id": STR, "object": {"const": "file"}, "deleted": {"const": True}}),
    "BatchError": _obj({"code": STR, "line": INT_OR_NULL, "message": STR, "param": STR_OR_NULL}),
    "Batch": _obj(
        {
            "id": STR,
            "object": {"const": "batch"},
            "endpoint": {"enum": list(ENDPOINTS)},
            "model": STR_OR_NULL,
            "errors": {
                "oneOf": [
                    {"type": "null"},
                    _obj({"object": {"const": "list"}, "data": {"type": "array", "items": _ref("BatchError")}}),
                ]
            },
            "input_file_id": STR,
            "completion_window": {"const": "24h"},
            "status": {"enum": BATCH_STATUSES},
            "output_file_id": STR_OR_NULL,
            "error_file_id": STR_OR_NULL,
            "created_at": INT,
            "in_progress_at": INT_OR_NULL,
            "expires_at": INT,
            "finalizing_at": INT_OR_NULL,
            "completed_at": INT_OR_NULL,
            "failed_at": INT_OR_NULL,
            "expired_at": INT_OR_NULL,
            "cancelling_at": INT_OR_NULL,
            "cancelled_at": INT_OR_NULL,
            "request_counts": _obj({"total": INT, "completed": INT, "failed": INT}),
            "metadata": {
                "type": ["object", "null"],
                "maxProperties": 16,
                "additionalProperties": {"type": "string", "maxLength": 512},
            },
            "usage": _obj(
                {
                    "input_tokens": INT,
                    "input_tokens_details": _obj({"cached_tokens": INT}),
                    "output_tokens": INT,
                    "output_tokens_details": _obj({"reasoning_tokens": INT}),
                    "total_tokens": INT,
                }
            ),
            "tidal": _obj(
                {
                    "priority": INT,
                    "laxity_seconds": NUM_OR_NULL,
                    "observed_rate": NUM_OR_NULL,
                    "model_served": {"type": ["boolean", "null"]},
                    "cost": _obj({"batch_usd": NUM, "online_usd": NUM, "saved_usd": NUM}),
                    "phase_split": {"enum": list(SPLIT_MODES)},
                    "kv_stored_bytes": INT,
                    "kv_storage_usd": NUM,
                },
                description="Tidal's extension: the batch's vLLM priority (100 = least urgent), seconds of "
                "slack left before it would miss its window at the observed rate, and that rate "
                "in items per second (null until the first re-score); for a batch in progress, "
                "whether a live worker node's engine serves its model (false: its items wait, "
                "queued, until one does or the window closes; null otherwise); and the cost in USD of "
                "its completed items at the batch price, at the online price, and the "
                "difference saved; its phase-split mode, the frozen KV it holds now in bytes, and "
                "what holding frozen KV has cost in USD.",
            ),
        }
    ),
}


def _list_schema(item: str) -> dict:
    return _obj(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref(item)},
            "first_id": STR_OR_NULL,
            "last_id": STR_OR_NULL,
            "has_more": BOOL,
        }
    )


SCHEMAS["FileList"] = _list_schema("File")
SCHEMAS["BatchList"] = _list_schema("Batch")

_ERROR_TEXT = {
    400: "Invalid parameter (code invalid_value, invalid_type, missing_required_parameter, invalid_json, "
    "too_many_lines).",
    401: "Missing (missing_api_key), unknown or revoked (invalid_api_key) API key.",
    404: "Unknown id. Another tenant's id, a deleted file and a malformed id answer exactly the same.",
    409: "The batch is completed, failed or expired (code batch_not_cancellable).",
    413: "Upload larger than the limit for its purpose (code file_too_large).",
    415: "The upload is not multipart/form-data (code unsupported_media_type).",
}
_REUSED = (409, "The Idempotency-Key was used in the last 24 hours with another request (code idempotency_key_reused).")


def _json(schema: str, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _op(summary: str, ok: dict, errors: t.Iterable[int | tuple[int, str]], **extra: t.Any) -> dict:
    """An operation; each error is a status (described by _ERROR_TEXT) or (status, its description here)."""
    described = [e if isinstance(e, tuple) else (e, _ERROR_TEXT[e]) for e in (401, *errors)]
    responses = {"200": ok, **{str(code): _json("Error", text) for code, text in described}}
    return {"summary": summary, "security": [{"bearer": []}], "responses": responses, **extra}


_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
    "description": "Within 24 hours, the same key with the same request answers the object the first one made; "
    "with another request, 409.",
}
_EXPIRES_AFTER_SECONDS = {"type": "integer", "minimum": 3600, "maximum": 2592000}


def _query(name: str, schema: dict, description: str) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _path_param(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": STR}


_AFTER = (
    "Cursor: the id of the last object of the previous page. An id the caller cannot see (unknown, "
    "another tenant's) answers 404 rather than an empty page; a file deleted since it was listed still works."
)

DOCUMENT: dict[str, t.Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "Tidal Batch API",
        "version": "1.0.0",
        "description": "OpenAI-compatible Files and Batches API. Errors use OpenAI's envelope.",
    },
    "components": {
        "schemas": SCHEMAS,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    },
    "paths": {
        "/openapi.json": {
            "get": {
                "summary": "This document.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "The OpenAPI document.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/health": {
            "get": {
                "summary": "Liveness: the API process answers.",
                "security": [],
                "responses": {"200": _json("Health", "Alive.")},
            }
        },
        "/ready": {
            "get": {
                "summary": "Readiness: SQL, Redis and the file storage answer.",
                "security": [],
                "responses": {
                    "200": _json("Readiness", "Ready: every check is `ok`."),
                    "503": _json("Readiness", "Not ready: the failing checks say why."),
                },
            }
        },
        "/v1/files": {
            "post": _op(
                "Upload a file (streamed to the file storage).",
                _json("File", "The stored file (or, for a retry under the same Idempotency-Key, the first one)."),
                (
                    (
                        400,
                        "Invalid parameter (invalid_value, invalid_type, missing_required_parameter, "
                        "too_many_lines), or the tenant's stored bytes would pass its quota "
                        "(storage_limit_exceeded).",
                    ),
                    (
                        409,
                        "The Idempotency-Key was used in the last 24 hours with another request "
                        "(idempotency_key_reused), or the file it made has been deleted since "
                        "(idempotency_key_file_deleted).",
                    ),
                    413,
                    415,
                ),
                parameters=[_IDEMPOTENCY_KEY],
                requestBody={
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["file", "purpose"],
                                "properties": {
                                    "file": {"type": "string", "format": "binary"},
                                    "purpose": {"enum": list(UPLOAD_PURPOSES)},
                                    "expires_after[anchor]": {"const": "created_at"},
                                    "expires_after[seconds]": _EXPIRES_AFTER_SECONDS,
                                },
                            }
                        }
                    },
                },
            ),
            "get": _op(
                "List the caller's files.",
                _json("FileList", "A page of files."),
                (400, 404),
                parameters=[
                    _query("after", STR, _AFTER),
                    _query(
                        "limit", {"type": "integer", "minimum": 1, "maximum": 10000, "default": 10000}, "Page size."
                    ),
                    _query("order", {"enum": ["asc", "desc"], "default": "desc"}, "By created_at."),
                    _query("purpose", {"enum": list(PURPOSES)}, "Only files of this purpose."),
                ],
            ),
        },
        "/v1/files/{file_id}": {
            "parameters": [_path_param("file_id")],
            "get": _op("Retrieve a file.", _json("File", "The file."), (404,)),
            "delete": _op("Delete a file and its bytes.", _json("FileDeleted", "Deleted."), (404,)),
        },
        "/v1/files/{file_id}/content": {
            "parameters": [_path_param("file_id")],
            "get": _op(
                "The file's bytes, streamed.",
                {
                    "description": "The bytes as uploaded (or as written, for output files).",
                    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                },
                (404,),
            ),
        },
        "/v1/batches": {
            "post": _op(
                "Create a batch. Input files up to TIDAL_SYNC_VALIDATE_BYTES are validated before the answer "
                "(status in_progress or failed); larger ones answer `validating`, or `failed` with "
                "token_limit_exceeded when their first lines alone are over the enqueued-token quota.",
                _json("Batch", "The batch (or, for a retry under the same Idempotency-Key, the first one)."),
                (
                    400,
                    404,
                    (
                        409,
                        f"{_REUSED[1]} Or the input file is still being validated for another of the caller's "
                        "batches (code input_file_in_use).",
                    ),
                    (413, "The JSON body is over 64 KB (code request_too_large)."),
                    (429, "The tenant's open batches are at its quota (code batch_limit_exceeded)."),
                ),
                parameters=[_IDEMPOTENCY_KEY],
                requestBody={
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["input_file_id", "endpoint", "completion_window"],
                                "properties": {
                                    "input_file_id": STR,
                                    "endpoint": {"enum": list(ENDPOINTS)},
                                    "completion_window": {"const": "24h"},
                                    "metadata": SCHEMAS["Batch"]["properties"]["metadata"],
                                    "output_expires_after": _obj(
                                        {"anchor": {"const": "created_at"}, "seconds": _EXPIRES_AFTER_SECONDS}
                                    ),
                                    "tidal": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "properties": {"phase_split": {"enum": list(SPLIT_MODES), "default": "auto"}},
                                        "description": "Tidal's options. phase_split: run items as a prefill "
                                        "phase now and a decode phase later (phase-split freeze / thaw): always, never, "
                                        "or auto (the laxity-driven default).",
                                    },
                                },
                            }
                        }
                    },
                },
            ),
            "get": _op(
                "List the caller's batches, newest first.",
                _json("BatchList", "A page of batches."),
                (400, 404),
                parameters=[
                    _query("after", STR, _AFTER),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}, "Page size."),
                ],
            ),
        },
        "/v1/batches/{batch_id}": {
            "parameters": [_path_param("batch_id")],
            "get": _op("Retrieve a batch.", _json("Batch", "The batch."), (404,)),
        },
        "/v1/batches/{batch_id}/cancel": {
            "parameters": [_path_param("batch_id")],
            "post": _op(
                "Cancel a batch. A cancelling or cancelled batch is returned unchanged.",
                _json("Batch", "The batch, now cancelling (or already cancelled)."),
                (404, 409),
            ),
        },
    },
}


@bp.get("/openapi.json")
def openapi_json() -> Response:
    return jsonify(DOCUMENT)
