"""gunicorn's own refusals in the API's envelope.

gunicorn answers what it refuses before the app runs (a request line past ``limit_request_line``, a header past
``limit_request_field_size``, a malformed request line or header) with an HTML page written by
``gunicorn.util.write_error``. ``install`` replaces that one function, so those answers are JSON in OpenAI's
envelope too, with the same status; every other path through gunicorn is unchanged.
"""

from __future__ import annotations

import json
import socket

from gunicorn import util

from tidal_api.errors import APIError

#: gunicorn's status -> the OpenAI-style code of its refusal.
CODES = {
    400: "invalid_request",
    403: "forbidden",
    414: "request_line_too_long",
    417: "expectation_failed",
    431: "request_header_too_large",
    500: "server_error",
    501: "not_implemented",
}
MAX_MESSAGE = 256  # gunicorn's message can quote the client's request line


def write_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """What ``gunicorn.util.write_error`` writes, as JSON: the status line, then the error object."""
    if status_int >= 500:
        error = APIError(
            status_int,
            "The server had an error while processing your request.",
            code=CODES.get(status_int, "server_error"),
            type="server_error",
        )
    else:
        error = APIError(status_int, f"{reason}: {mesg[:MAX_MESSAGE]}" if mesg else reason, code=CODES.get(status_int))
    body = json.dumps(error.body()).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    """From here on, gunicorn writes its refusals with :func:`write_error` (call in the master, before forking)."""
    util.write_error = write_error


__all__ = ["install", "write_error"]
