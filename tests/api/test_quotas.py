"""Per-tenant quotas over real HTTP: open batches (429), stored bytes (400; outputs count, and a tenant at the limit
starts no batch), enqueued tokens per model (the batch fails validation with token_limit_exceeded, at create when
a large file's first lines alone are over). Nothing refused is stored or queued."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy import update

from tests.support.api_helpers import CHAT
from tests.support.api_helpers import error_of
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line
from tidal_workers import finalize
from tidal_workers import keys
from tidal_workers.ingest import ingest_batch
from tidal_workers.policy.body import Bounds
from tidal_workers.policy.body import estimate_tokens
from tidal_workers.quotas import stored_bytes
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import Item

OPEN_BATCHES = 5
LINES = 3
MAX_TOKENS = 100


@pytest.fixture
def settings(settings):
    line_tokens = _tokens(request_line("x", max_tokens=MAX_TOKENS))
    limits = {
        "acme": {
            "open_batches": OPEN_BATCHES,
            # two batches of LINES lines of tiny fit at once; tiny-2 has a budget of its own
            "enqueued_tokens": {"*": 2 * LINES * line_tokens, "tiny-2": 10 * LINES * line_tokens},
            "stored_bytes": 10_000,
        },
    }
    return settings.replace(tenant_limits=json.dumps(limits))


def _tokens(line: dict) -> int:
    return estimate_tokens(CHAT, line["body"], Bounds())


def _create(http: httpx.Client, file_id: str) -> httpx.Response:
    return http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"})


def _upload(http: httpx.Client, content: bytes) -> httpx.Response:
    return http.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})


def _lines(model: str = "tiny", n: int = LINES) -> bytes:
    return jsonl([request_line(f"r{i}", f"hello {i}", model=model, max_tokens=MAX_TOKENS) for i in range(n)])


def test_enqueued_tokens_per_model_fail_the_batch_that_would_pass_them(http, rt):
    tiny = _upload(http, _lines()).json()["id"]
    first, second, third = (_create(http, tiny).json() for _ in range(3))
    assert (first["status"], second["status"]) == ("in_progress", "in_progress")
    assert third["status"] == "failed" and third["request_counts"]["total"] == 0
    (error,) = third["errors"]["data"]
    line_tokens = _tokens(request_line("x", max_tokens=MAX_TOKENS))
    limit = 2 * LINES * line_tokens
    assert error["code"] == "token_limit_exceeded" and error["line"] is None
    assert (
        f"Enqueued token limit reached for tiny for tenant acme. Limit: {limit:,} enqueued tokens" in error["message"]
    )
    with rt.store.read() as s:
        assert s.scalar(select(func.count()).select_from(Item).where(Item.batch_id == third["id"])) == 0
        held = dict(s.execute(select(Batch.id, Batch.enqueued_tokens)).all())
    assert held[first["id"]] == held[second["id"]] > 0 and held[third["id"]] == 0
    assert rt.redis.zcard(keys.ready(third["id"])) == 0
    # another model has its own budget
    other = _create(http, _upload(http, _lines("tiny-2")).json()["id"]).json()
    assert other["status"] == "in_progress", other["errors"]
    # a batch that finishes gives its tokens back
    assert http.post(f"/v1/batches/{first['id']}/cancel").json()["status"] == "cancelling"  # the finalize requested
    assert finalize.perform_finalize(rt, first["id"])  # the ops worker's part: nothing in flight, so cancelled
    assert _create(http, tiny).json()["status"] == "in_progress"


def test_lines_without_max_tokens_count_at_the_model_limit(rt):
    bounds = Bounds(max_output_tokens=1000, prompt_bytes_per_token=4.0)
    line = request_line("x", "12345678")  # 12 bytes of text ("user" and the content), one message
    assert estimate_tokens(CHAT, line["body"], bounds) == 3 + 4 + 1000
    assert estimate_tokens(CHAT, {**line["body"], "max_tokens": 10}, bounds) == 3 + 4 + 10
    embedding = {"model": "e", "input": [[1, 2, 3], "abcd"]}  # token ids count one each; no output
    assert estimate_tokens("/v1/embeddings", embedding, bounds) == 3 + 1


def test_frozen_kv_counts_against_the_stored_bytes(http, rt):
    """A batch's frozen KV (the phase split, as beat last measured it) fills the quota as files do."""
    first = _upload(http, _lines())
    assert first.status_code == 200
    batch = _create(http, first.json()["id"]).json()["id"]
    with rt.store.transaction() as s:
        s.get(Batch, batch).kv_stored_bytes = 8_000
    r = _upload(http, b"y" * 3_000)
    assert r.status_code == 400 and error_of(r)["code"] == "storage_limit_exceeded", r.text
    with rt.store.transaction() as s:
        s.get(Batch, batch).kv_stored_bytes = 0  # the batch ended: its folder was deleted
    assert _upload(http, b"y" * 3_000).status_code == 200


def test_stored_bytes_refuse_an_upload_past_the_quota_and_keep_nothing(http, rt):
    first = _upload(http, b"x" * 6_000)  # a batch file's content is checked later, at batch create
    assert first.status_code == 200
    r = _upload(http, b"y" * 6_000)
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == "storage_limit_exceeded" and "Limit: 10,000 bytes" in err["message"], err
    # refused before reading: a declared body past the room left
    big = http.post(
        "/v1/files",
        content=b"z" * 200_000,
        headers={"Content-Type": "multipart/form-data; boundary=b", "Content-Length": "200000"},
    )
    assert big.status_code == 400 and error_of(big)["code"] == "storage_limit_exceeded"
    with rt.store.read() as s:
        assert [f.id for f in s.scalars(select(File))] == [first.json()["id"]]
    assert len(list(rt.blobs.names())) == 1
    # deleting frees the room
    assert http.delete(f"/v1/files/{first.json()['id']}").status_code == 200
    assert _upload(http, b"y" * 6_000).status_code == 200


def test_a_large_file_whose_first_lines_alone_are_over_the_token_quota_fails_at_create_with_no_ingest(
    http, rt, settings
):
    """Tokens are estimated before an ingest is queued: from the whole lines in the file's first
    TIDAL_SYNC_VALIDATE_BYTES (what is validated inline anyway). Every line counts, so first lines over the quota
    are a sure refusal: the batch fails at once as its ingest would fail it, and costs no ingest."""
    rt.settings = settings.replace(sync_validate_bytes=len(_lines()))  # LINES lines are read; larger files queue
    # 50 lines with no max_tokens: each counts at the model's 32k output limit, far past acme's tokens
    unbounded = jsonl([request_line(f"r{i}", f"hello {i}") for i in range(50)])
    batch = _create(http, _upload(http, unbounded).json()["id"]).json()
    assert (batch["status"], batch["model"], batch["request_counts"]["total"]) == ("failed", "tiny", 0)
    assert batch["failed_at"] is not None and batch["in_progress_at"] is None
    line_tokens = _tokens(request_line("x", max_tokens=MAX_TOKENS))
    read = unbounded[: rt.settings.sync_validate_bytes].count(b"\n")  # the whole lines the estimate reads
    first_lines = sum(_tokens(request_line(f"r{i}", f"hello {i}")) for i in range(read))
    assert batch["errors"] == {
        "object": "list",
        "data": [
            {
                "code": "token_limit_exceeded",
                "line": None,
                "param": None,
                "message": f"Enqueued token limit reached for tiny for tenant acme. Limit: {2 * LINES * line_tokens:,} "
                f"enqueued tokens; this batch needs {first_lines:,} (estimated) and unfinished batches hold 0. "
                "Please try again once some in_progress batches have been completed.",
            }
        ],
    }
    assert rt.redis.llen("tidal.ingest") == 0  # refused before any ingest was queued

    # A tenant at its quota: each further large batch is refused at once, however many it creates.
    for _ in range(2):
        assert _create(http, _upload(http, _lines()).json()["id"]).json()["status"] == "in_progress"  # inline
    large = _upload(http, _lines(n=2 * LINES)).json()["id"]  # past the inline size
    assert [_create(http, large).json()["status"] for _ in range(3)] == ["failed"] * 3
    assert rt.redis.llen("tidal.ingest") == 0


def test_first_lines_under_the_token_quota_leave_the_verdict_to_the_ingest(http, rt, settings):
    """The estimate is a lower bound: a file whose first lines fit is queued, and its ingest judges the whole."""
    rt.settings = settings.replace(sync_validate_bytes=len(_lines()))
    three_batches = _lines(n=3 * LINES)  # its first LINES lines fit; the whole is past the 2 * LINES lines allowed
    batch = _create(http, _upload(http, three_batches).json()["id"]).json()
    assert batch["status"] == "validating" and rt.redis.llen("tidal.ingest") == 1
    ingest_batch(rt, batch["id"])  # what the task does
    assert http.get(f"/v1/batches/{batch['id']}").json()["errors"]["data"][0]["code"] == "token_limit_exceeded"


def test_outputs_past_the_stored_bytes_are_written_then_new_batches_are_refused(http, rt, caplog):
    """A batch's output file counts against the stored bytes; finalize writes it even past the limit (the results
    are the only copy of work done and billed), and the tenant is then refused new uploads and batches until it
    frees room."""
    source = _upload(http, _lines()).json()["id"]
    batch = _create(http, source).json()
    assert batch["status"] == "in_progress", batch["errors"]
    body = json.dumps({"object": "chat.completion", "text": "x" * 4_000})  # 3 lines: ~12 KB against 10,000
    with rt.store.transaction() as s:
        s.execute(
            update(Item)
            .where(Item.batch_id == batch["id"])
            .values(status="completed", response_status=200, request_id="r", response_body=body)
        )
        s.get(Batch, batch["id"]).completed = LINES
    with caplog.at_level(logging.WARNING, logger="tidal_workers.finalize"):
        assert finalize.perform_finalize(rt, batch["id"])  # what the ops worker does once the last item is written
    assert "past its limit of 10000; written anyway" in caplog.text  # the operator is told
    done = http.get(f"/v1/batches/{batch['id']}").json()
    assert done["status"] == "completed" and done["errors"] is None
    output = http.get(f"/v1/files/{done['output_file_id']}/content")
    assert output.status_code == 200 and len(output.text.splitlines()) == LINES  # nothing withheld
    with rt.store.read() as s:
        assert stored_bytes(s, "acme") == sum(s.scalars(select(File.bytes))) > 10_000  # outputs count

    refused = _create(http, source)
    assert refused.status_code == 400 and error_of(refused)["code"] == "storage_limit_exceeded", refused.text
    assert "a batch's output and error files need room" in error_of(refused)["message"]
    assert _upload(http, b"y").status_code == 400
    with rt.store.read() as s:
        assert s.scalar(select(func.count()).select_from(Batch)) == 1  # nothing created
    assert http.delete(f"/v1/files/{done['output_file_id']}").status_code == 200  # downloaded: room again
    assert _create(http, source).json()["status"] == "in_progress"
