"""Idempotency-Key on POST /v1/batches and POST /v1/files: a retried create answers the first object."""

from __future__ import annotations

import threading

import openai
import pytest
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy import update

from tests.support.api_helpers import CHAT
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import IdempotencyKey

LINES = jsonl([request_line("1"), request_line("2")])


def _count(rt, model) -> int:
    with rt.store.read() as s:
        return s.scalar(select(func.count()).select_from(model))


def _create(client: openai.OpenAI, file_id: str, key: str, **extra):
    return client.batches.create(
        input_file_id=file_id,
        endpoint=CHAT,
        completion_window="24h",
        extra_headers={"Idempotency-Key": key},
        **extra,
    )


def test_a_retried_batch_create_returns_the_same_batch(acme, globex, batch_file, rt):
    file_id = batch_file([request_line("1"), request_line("2")])
    first = _create(acme, file_id, "create-7")
    again = _create(acme, file_id, "create-7")
    assert again.id == first.id and _count(rt, Batch) == 1
    acme.batches.cancel(first.id)
    assert _create(acme, file_id, "create-7").status == "cancelling"  # the first batch, as it stands now

    with pytest.raises(openai.ConflictError) as conflict:  # the same key, another request
        _create(acme, file_id, "create-7", metadata={"run": "2"})
    assert conflict.value.code == "idempotency_key_reused" and conflict.value.param == "Idempotency-Key"
    assert "different request" in conflict.value.message and _count(rt, Batch) == 1

    assert _create(acme, file_id, "create-8").id != first.id  # another key: another batch
    theirs = globex.files.create(file=("g.jsonl", LINES), purpose="batch").id
    assert _create(globex, theirs, "create-7").id != first.id  # keys are per tenant
    assert _count(rt, Batch) == 3


def test_a_key_is_forgotten_after_24_hours(acme, batch_file, rt):
    file_id = batch_file([request_line("1")])
    first = _create(acme, file_id, "daily")
    with rt.store.transaction() as s:
        s.execute(update(IdempotencyKey).values(created_at=IdempotencyKey.created_at - 24 * 3600))
    second = _create(acme, file_id, "daily", metadata={"k": "v"})  # another request: no conflict, the key is new
    assert second.id != first.id and _count(rt, Batch) == 2


def test_a_retried_upload_returns_the_same_file_and_keeps_one_copy(acme, rt):
    def upload(content: bytes, key: str = "up-1", **kw):
        return acme.files.create(
            file=("in.jsonl", content), purpose="batch", extra_headers={"Idempotency-Key": key}, **kw
        )

    first = upload(LINES)
    again = upload(LINES)  # a new multipart boundary, the same request
    assert again.id == first.id and _count(rt, File) == 1 and len(list(rt.blobs.names())) == 1
    with pytest.raises(openai.ConflictError) as conflict:
        upload(LINES + LINES)
    assert conflict.value.code == "idempotency_key_reused"
    with pytest.raises(openai.ConflictError):
        upload(LINES, extra_body={"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"})
    assert _count(rt, File) == 1 and len(list(rt.blobs.names())) == 1  # the refused bytes were not kept


def test_racing_creates_with_one_key_make_one_batch(live_api, batch_file, rt):
    """Whichever request commits first, both answer the one batch it made."""
    file_id = batch_file([request_line("1")])
    ids: list[str] = []
    go = threading.Barrier(4)

    def create() -> None:
        with openai.OpenAI(base_url=live_api.url + "/v1", api_key="acme-key", max_retries=0) as client:
            go.wait()
            ids.append(_create(client, file_id, "race").id)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(ids) == 4 and len(set(ids)) == 1 and _count(rt, Batch) == 1
