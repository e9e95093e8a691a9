"""Hostile and malformed requests: every answer is a 4xx in OpenAI's envelope, never a 500."""

from __future__ import annotations

import httpx

from tests.support.api_helpers import CHAT
from tests.support.api_helpers import error_of

MULTIPART_X = {"Content-Type": "multipart/form-data; boundary=x"}
NOT_UTF8 = (
    b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n\xed\xb3\xbf\r\n'  # a lone surrogate
    b'--x\r\nContent-Disposition: form-data; name="file"; filename="\xff\xfe"\r\n\r\n{}\r\n--x--\r\n'
)
DEEP = b'{"input_file_id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"

BAD = [
    ("POST", "/v1/files", {"content": b"garbage", "headers": {"Content-Type": "multipart/form-data"}}),
    ("POST", "/v1/files", {"content": b"--x\r\ngarbage", "headers": MULTIPART_X}),
    ("POST", "/v1/files", {"content": b"", "headers": MULTIPART_X}),
    ("POST", "/v1/files", {"files": {"file": ("a", b"{}")}, "data": {"purpose": "batch\x00"}}),
    ("POST", "/v1/files", {"content": NOT_UTF8, "headers": MULTIPART_X}),
    ("POST", "/v1/files", {"content": b"x" * 10, "headers": {"Content-Type": "text/plain"}}),
    ("PUT", "/v1/files", {}),
    ("GET", "/v1/files", {"params": {"limit": "1e3"}}),
    ("GET", "/v1/files", {"params": {"limit": "-1"}}),
    ("GET", "/v1/files", {"params": {"limit": "9" * 400}}),
    ("GET", "/v1/files", {"params": {"after": "a\x00b"}}),
    ("GET", "/v1/files", {"params": {"purpose": "batch\x00"}}),
    ("GET", "/v1/files", {"params": {"order": "\u00e9"}}),
    ("GET", "/v1/files/%00", {}),
    ("GET", "/v1/files/%ff%fe", {}),
    ("GET", "/v1/files/" + "x" * 10_000, {}),
    ("DELETE", "/v1/files/..%2F..%2F", {}),
    ("PATCH", "/v1/files/file-x", {}),
    ("POST", "/v1/batches", {"content": DEEP, "headers": {"Content-Type": "application/json"}}),
    ("POST", "/v1/batches", {"content": b'{"input_file_id": "\xff"}', "headers": {"Content-Type": "application/json"}}),
    ("POST", "/v1/batches", {"json": {"input_file_id": "a\x00", "endpoint": CHAT, "completion_window": "24h"}}),
    ("POST", "/v1/batches", {"json": {"input_file_id": {"$ne": 1}, "endpoint": CHAT, "completion_window": "24h"}}),
    ("POST", "/v1/batches", {"json": {"input_file_id": "f", "endpoint": [CHAT], "completion_window": "24h"}}),
    ("POST", "/v1/batches", {"json": {"input_file_id": "f", "endpoint": CHAT, "completion_window": 24}}),
    (
        "POST",
        "/v1/batches",
        {"json": {"input_file_id": "f", "endpoint": CHAT, "completion_window": "24h", "metadata": {"k\x00": "v\x00"}}},
    ),
    ("POST", "/v1/batches", {"content": b"null", "headers": {"Content-Type": "application/json"}}),
    ("GET", "/v1/batches", {"params": {"limit": "twenty"}}),
    ("GET", "/v1/batches", {"params": {"after": "\x00"}}),
    ("GET", "/v1/batches/%00", {}),
    ("POST", "/v1/batches/%00/cancel", {}),
    ("DELETE", "/v1/batches/batch_x", {}),
    ("GET", "/v1/nothing/here", {}),
]


def test_bad_input_is_a_4xx_in_the_envelope(http):
    for method, path, kw in BAD:  # one live server for all of them
        r = http.request(method, path, **kw)
        assert 400 <= r.status_code < 500, (method, path[:60], r.text[:300])
        error_of(r)


def test_wrong_method_says_what_is_allowed(http):
    r = http.put("/v1/batches")
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"
    assert {m.strip() for m in r.headers["allow"].split(",")} >= {"GET", "POST"}


def test_bad_authorization_headers(live_api):
    for value in (b"Bearer", b"Bearer acme-key extra", b"bearer \xff\xfe", b"Bearer a\tb", b"Token acme-key"):
        r = httpx.get(live_api.url + "/v1/files", headers={"Authorization": value})
        assert r.status_code == 401, value
        error_of(r)
