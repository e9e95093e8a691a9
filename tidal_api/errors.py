"""Every error leaves the API in OpenAI's envelope: {"error": {"message", "type", "param", "code"}}.

Views raise :class:`APIError`; werkzeug's HTTP errors (unknown URL, wrong
method, body too large) and anything unexpected are mapped here too, so no
response ever carries an HTML page or a bare 500 for something the client sent.
"""

from __future__ import annotations

import logging

from flask import Flask
from flask import Response
from flask import jsonify
from flask import request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)

#: werkzeug status -> OpenAI-style code, for errors raised before a view runs.
_HTTP_CODES = {
    400: "invalid_request",
    404: "unknown_url",
    405: "method_not_allowed",
    413: "file_too_large",
    415: "unsupported_media_type",
}


class APIError(Exception):
    """An error the client can act on; rendered with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def missing(param: str) -> APIError:
    return APIError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def invalid_value(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def invalid_type(param: str, expected: str) -> APIError:
    return APIError(400, f"Invalid type for '{param}': expected {expected}.", param=param, code="invalid_type")


def file_not_found(file_id: str, param: str = "file_id") -> APIError:
    """The one answer for an unknown, deleted or another tenant's file: nothing tells them apart."""
    return APIError(404, f"No such File object: {file_id}", param=param)


def batch_not_found(batch_id: str, param: str = "batch_id") -> APIError:
    return APIError(404, f"No batch found with id '{batch_id}'.", param=param)


def _render(err: APIError) -> tuple[Response, int]:
    return jsonify(err.body()), err.status


def _http_error(exc: HTTPException) -> tuple[Response, int, list[tuple[str, str]]]:
    status = exc.code or 500
    message = f"Invalid URL ({request.method} {request.path})" if status == 404 else (exc.description or exc.name)
    body, status = _render(APIError(status, message, code=_HTTP_CODES.get(status)))
    # keep werkzeug's headers that matter to the client (Allow on a 405)
    headers = [(k, v) for k, v in exc.get_headers() if k.lower() != "content-type"]
    return body, status, headers


def _unexpected(exc: Exception) -> tuple[Response, int]:
    log.exception("unhandled error")
    return _render(
        APIError(
            500, "The server had an error while processing your request.", code="server_error", type="server_error"
        )
    )


def init_app(app: Flask) -> None:
    app.register_error_handler(APIError, _render)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
