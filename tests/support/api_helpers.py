"""Builders of batch input lines and checks of the error envelope, shared by the API tests."""

from __future__ import annotations

import json

import httpx

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def request_line(custom_id: str, content: str = "hello", *, model: str = "tiny", url: str = CHAT, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": model, "messages": [{"role": "user", "content": content}], **body},
    }


def jsonl(lines: list) -> bytes:
    """Dicts become JSON lines; strings are written as they are (for broken lines)."""
    return b"".join((line if isinstance(line, str) else json.dumps(line)).encode() + b"\n" for line in lines)


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def responses_line(custom_id: str, **body) -> dict:
    """A batch input line for `/v1/responses` on the tiny model."""
    return {"custom_id": custom_id, "method": "POST", "url": RESPONSES, "body": {"model": "tiny", **body}}
