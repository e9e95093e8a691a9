"""An upload is written once: the file part streams into the blob storage as it arrives, never spooled first.

Whatever order the form's parts come in, the limits and errors are those of tests/api/test_files.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.api_helpers import error_of
from tests.support.fault_helpers import SlowUpload
from tests.support.wait import wait_for

LIMIT_BYTES, LIMIT_LINES = 4096, 10


def _parts(*parts: tuple[str, str | None, bytes]) -> tuple[bytes, dict[str, str]]:
    """A multipart body of (name, filename or None, content) parts, in the order given."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--b0undary\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n"
    return out + b"--b0undary--\r\n", {"Content-Type": "multipart/form-data; boundary=b0undary"}


def _blobs(rt) -> list[str]:
    return sorted(p.name for p in rt.settings.blob_path.iterdir()) if rt.settings.blob_path.exists() else []


@pytest.fixture
def settings(settings):
    return settings.replace(max_file_bytes=LIMIT_BYTES, max_file_lines=LIMIT_LINES, max_upload_bytes=16 << 20)


def test_the_file_reaches_storage_while_the_client_is_still_sending(live_api, rt):
    """A spooled upload would show nothing in storage before its last byte arrived."""
    host, port = live_api.url.removeprefix("http://").split(":")
    upload = SlowUpload(host, int(port), total_body=8 << 20, purpose="user_data")
    try:
        for _ in range(16):
            upload.send(256 << 10)  # 4 MiB of 8
        parts = lambda: [p for p in rt.settings.blob_path.glob(".*.part") if p.stat().st_size >= 2 << 20]  # noqa: E731
        wait_for(parts, 30, what="the upload's first megabytes in the blob storage")
        answer = upload.finish()
    finally:
        upload.close()
    assert b" 200 OK" in answer.split(b"\r\n", 1)[0], answer[:500]
    file = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert (file["bytes"], file["purpose"]) == (8 << 20, "user_data")
    assert [p.name for p in rt.settings.blob_path.iterdir()] == list(rt.blobs.names())  # one blob, no part left


@pytest.fixture
def raw(live_api):
    with httpx.Client(base_url=live_api.url, headers={"Authorization": "Bearer acme-key"}, timeout=30) as client:

        def post(*parts):
            body, headers = _parts(*parts)
            return client.post("/v1/files", content=body, headers=headers)

        yield post


def test_a_file_part_before_its_purpose_meets_the_same_limits(raw, rt):
    ten = b"".join(b'{"n": %d}\n' % i for i in range(LIMIT_LINES))
    r = raw(("file", "a.jsonl", ten), ("purpose", None, b"batch"))
    assert r.status_code == 200 and r.json()["purpose"] == "batch" and r.json()["bytes"] == len(ten)
    kept = _blobs(rt)
    r = raw(("file", "a.jsonl", ten + b'{"n": 10}\n'), ("purpose", None, b"batch"))
    assert r.status_code == 400 and (error_of(r)["code"], error_of(r)["param"]) == ("too_many_lines", "file")
    r = raw(("file", "big.jsonl", b"x" * (LIMIT_BYTES + 1)), ("purpose", None, b"batch"))
    assert r.status_code == 413 and error_of(r)["code"] == "file_too_large"
    assert error_of(r)["message"] == f"File is too large: at most {LIMIT_BYTES} bytes for purpose 'batch'."
    r = raw(("file", "big.txt", b"x" * (LIMIT_BYTES + 1)), ("purpose", None, b"user_data"))
    assert r.status_code == 200  # not a batch file
    r = raw(("file", "a.jsonl", ten))
    assert r.status_code == 400 and error_of(r)["param"] == "purpose"
    r = raw(("file", "a.jsonl", ten), ("purpose", None, b"nope"))
    assert r.status_code == 400 and (error_of(r)["code"], error_of(r)["param"]) == ("invalid_value", "purpose")
    assert len(_blobs(rt)) == len(kept) + 1  # nothing refused was kept: only the user_data file was added


def test_only_the_first_file_part_is_kept_and_other_parts_are_skipped(raw, rt):
    r = raw(
        ("note", "n.txt", b"skipped" * 1000),
        ("purpose", None, b"evals"),
        ("file", "first.jsonl", b"{}\n"),
        ("file", "second.jsonl", b"{}\n{}\n"),
        ("purpose", None, b"batch"),
    )
    assert r.status_code == 200, r.text
    assert (r.json()["filename"], r.json()["bytes"], r.json()["purpose"]) == ("first.jsonl", 3, "evals")
    assert len(_blobs(rt)) == 1


def test_a_form_field_is_short(raw, rt):
    r = raw(("purpose", None, b"b" * (64 * 1024 + 1)), ("file", "a.jsonl", b"{}\n"))
    assert r.status_code == 400 and (error_of(r)["code"], error_of(r)["param"]) == ("invalid_value", "purpose")
    assert _blobs(rt) == []


def test_what_follows_the_closing_boundary_is_drained_not_kept(live_api, rt):
    """The decoder's buffer is bounded (multipart.MAX_BUFFER_BYTES) outside a part's data; an epilogue after the
    closing boundary (RFC 2046 allows one) is read out, not buffered, so the upload stands whatever follows it."""
    body, headers = _parts(("purpose", None, b"batch"), ("file", "a.jsonl", b"{}\n"))
    epilogue = b"ignored epilogue " * (2 << 16)  # 2 MiB, far past the buffer bound
    r = httpx.post(
        live_api.url + "/v1/files",
        content=body + epilogue,
        headers={**headers, "Authorization": "Bearer acme-key"},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["bytes"] == 3, r.text
    assert len(_blobs(rt)) == 1
