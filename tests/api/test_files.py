"""/v1/files through the openai SDK (and raw HTTP where the SDK cannot go) against a live server."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.api_helpers import error_of
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line

LIMIT_BYTES, LIMIT_LINES, LIMIT_ANY = 4096, 10, 16384


@pytest.fixture
def settings(settings):
    return settings.replace(
        max_file_bytes=LIMIT_BYTES, max_file_lines=LIMIT_LINES, max_upload_bytes=LIMIT_ANY, file_expiry_seconds=3600
    )


def test_upload_retrieve_content_delete(acme, rt):
    data = jsonl([request_line(f"r{i}") for i in range(3)])
    f = acme.files.create(file=("input.jsonl", data), purpose="batch")
    assert (f.object, f.bytes, f.filename, f.purpose, f.status) == (
        "file",
        len(data),
        "input.jsonl",
        "batch",
        "processed",
    )
    assert f.expires_at == f.created_at + 3600
    assert acme.files.retrieve(f.id) == f
    assert acme.files.content(f.id).content == data
    deleted = acme.files.delete(f.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (f.id, "file", True)
    with pytest.raises(openai.NotFoundError):
        acme.files.retrieve(f.id)
    assert list(rt.settings.blob_path.iterdir()) == []  # the bytes went with it


def test_content_is_streamed_in_chunks(acme, http):
    data = bytes(range(256)) * 40  # 10 KiB, binary, no newline at the end
    f = acme.files.create(file=("blob.bin", data), purpose="user_data")
    with http.stream("GET", f"/v1/files/{f.id}/content") as r:
        assert r.status_code == 200 and r.headers["content-length"] == str(len(data))
        assert b"".join(r.iter_bytes()) == data


@pytest.mark.parametrize("purpose", ["assistants", "batch", "fine-tune", "vision", "user_data", "evals"])
def test_every_upload_purpose_is_accepted(acme, purpose):
    assert acme.files.create(file=("x.jsonl", b"{}\n"), purpose=purpose).purpose == purpose


def test_batch_limits(acme):
    exactly = jsonl([{"n": i} for i in range(LIMIT_LINES)])
    assert acme.files.create(file=("ok.jsonl", exactly), purpose="batch").bytes == len(exactly)
    no_final_newline = exactly + b'{"n": 10}'  # 11 lines: the last one has no newline
    with pytest.raises(openai.BadRequestError) as e:
        acme.files.create(file=("long.jsonl", no_final_newline), purpose="batch")
    assert (e.value.code, e.value.param) == ("too_many_lines", "file")
    big = b"x" * (LIMIT_BYTES + 1)
    with pytest.raises(openai.APIStatusError) as e:
        acme.files.create(file=("big.jsonl", big), purpose="batch")
    assert (e.value.status_code, e.value.code) == (413, "file_too_large")
    assert acme.files.create(file=("big.txt", big), purpose="user_data").bytes == len(big)  # not a batch file


def test_upload_limit_of_any_purpose(acme, http, rt):
    with pytest.raises(openai.APIStatusError) as e:
        acme.files.create(file=("big.bin", b"x" * (LIMIT_ANY + 1)), purpose="user_data")
    assert (e.value.status_code, e.value.code) == (413, "file_too_large")
    # far past the limit werkzeug refuses the body before parsing it; same envelope
    r = http.post("/v1/files", files={"file": ("huge.bin", b"x" * (LIMIT_ANY + 200_000))}, data={"purpose": "evals"})
    assert r.status_code == 413 and error_of(r)["code"] == "file_too_large"
    assert list(rt.settings.blob_path.iterdir()) == []  # nothing half-written is kept


def test_upload_errors(http):
    r = http.post("/v1/files", json={"purpose": "batch"})
    assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type"
    r = http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")})
    assert r.status_code == 400 and error_of(r) == {
        **error_of(r),
        "code": "missing_required_parameter",
        "param": "purpose",
    }
    r = http.post("/v1/files", files={"other": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert r.status_code == 400 and (error_of(r)["code"], error_of(r)["param"]) == (
        "missing_required_parameter",
        "file",
    )
    r = http.post("/v1/files", data={"purpose": "batch", "file": "not a file part"}, files={"x": ("x", b"")})
    assert r.status_code == 400 and error_of(r)["param"] == "file"
    r = http.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "batch_output"})
    assert r.status_code == 400 and (error_of(r)["code"], error_of(r)["param"]) == ("invalid_value", "purpose")


def test_odd_filenames_are_stored_safely(http):
    r = http.post("/v1/files", files={"file": ("../../etc/\x00passwd" + "é" * 600, b"{}\n")}, data={"purpose": "evals"})
    assert r.status_code == 200
    assert "\x00" not in r.json()["filename"] and len(r.json()["filename"]) <= 512


def test_list_order_limit_purpose_and_cursor(acme):
    ids = [acme.files.create(file=(f"{i}.jsonl", b"{}\n"), purpose="batch" if i % 2 else "evals").id for i in range(5)]
    page = acme.files.list()
    assert {f.id for f in page.data} == set(ids) and not page.has_more
    newest_first = ids[::-1]  # creation order, even within one second (the files' seq)
    assert [f.id for f in page.data] == newest_first
    assert [f.id for f in acme.files.list(order="asc").data] == newest_first[::-1]
    assert {f.id for f in acme.files.list(purpose="batch").data} == {ids[1], ids[3]}
    first = acme.files.list(limit=2)
    assert [f.id for f in first.data] == newest_first[:2] and first.has_more
    walked = [f.id for f in acme.files.list(limit=2)]  # the SDK follows `after` itself
    assert walked == newest_first
    # a cursor deleted while paging still works
    acme.files.delete(newest_first[1])
    rest = acme.files.list(after=newest_first[1], limit=10)
    assert [f.id for f in rest.data] == newest_first[2:] and not rest.has_more


def test_list_parameter_errors(acme, globex):
    for params, param in (
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"order": "up"}, "order"),
        ({"purpose": "nope"}, "purpose"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            acme.files.list(**params)
        assert e.value.param == param
    with pytest.raises(openai.BadRequestError) as e:
        acme.files.list(extra_query={"limit": "ten"})
    assert e.value.code == "invalid_type"
    theirs = globex.files.create(file=("g.jsonl", b"{}\n"), purpose="batch").id
    with pytest.raises(openai.NotFoundError) as e:
        acme.files.list(after=theirs)
    assert e.value.param == "after"


def _not_found_shape(response, file_id):
    err = error_of(response)
    return response.status_code, err["message"].replace(file_id, "<id>"), err["type"], err["param"], err["code"]


@pytest.mark.parametrize("suffix,method", [("", "GET"), ("/content", "GET"), ("", "DELETE")])
def test_unknown_foreign_deleted_and_malicious_ids_look_the_same(acme, globex, live_api, suffix, method):
    theirs = globex.files.create(file=("g.jsonl", b"{}\n"), purpose="batch").id
    gone = acme.files.create(file=("d.jsonl", b"{}\n"), purpose="batch").id
    acme.files.delete(gone)
    with httpx.Client(base_url=live_api.url, headers={"Authorization": "Bearer acme-key"}) as http:

        def shape(file_id, raw=None):
            return _not_found_shape(http.request(method, f"/v1/files/{raw or file_id}{suffix}"), file_id)

        expected = shape("file-000000000000000000000000")
        assert expected[0] == 404
        assert shape(theirs) == expected
        assert shape(gone) == expected
        assert shape("' OR '1'='1", raw="%27%20OR%20%271%27%3D%271") == expected
        assert shape("../../../etc/passwd", raw="..%2F..%2F..%2Fetc%2Fpasswd") == expected
        assert shape("a\x00b", raw="a%00b") == expected
    # and through the SDK, which quotes the id itself
    with pytest.raises(openai.NotFoundError):
        acme.files.retrieve("../../etc/passwd")
    assert globex.files.retrieve(theirs).id == theirs  # it does exist, for its owner


def test_authentication(live_api, acme):
    files = {"file": ("a.jsonl", b"{}\n")}
    r = httpx.get(live_api.url + "/v1/files")
    assert r.status_code == 401 and error_of(r)["code"] == "missing_api_key"
    r = httpx.get(live_api.url + "/v1/files", headers={"Authorization": "Basic YWNtZTprZXk="})
    assert r.status_code == 401 and error_of(r)["code"] == "missing_api_key"
    r = httpx.post(
        live_api.url + "/v1/files",
        headers={"Authorization": "Bearer sk-wrong-key-123"},
        files=files,
        data={"purpose": "batch"},
    )
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    assert "wrong-key" not in error_of(r)["message"]  # the key is not echoed back
    with (
        openai.OpenAI(base_url=live_api.url + "/v1", api_key="nope", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError) as e,
    ):
        bad.files.list()
    assert e.value.code == "invalid_api_key"
