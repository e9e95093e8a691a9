"""The API and ingest on S3 storage (moto's server over HTTP): a fleet's storage (a batch finalized onto it on the real
engine: tests/e2e/test_s3_real_engine.py)."""

from __future__ import annotations

import json
import os

import httpx
import openai
import pytest
from sqlalchemy import func
from sqlalchemy import select

from tests.support.storage_helpers import PART_BYTES
from tests.support.storage_helpers import everything
from tests.support.storage_helpers import with_s3
from tidal_workers.store.models import Item


@pytest.fixture
def settings(settings, s3_endpoint, bucket):
    return with_s3(settings, s3_endpoint, bucket).replace(
        max_upload_bytes=PART_BYTES + PART_BYTES // 2, max_file_bytes=PART_BYTES + PART_BYTES // 2, max_file_lines=10
    )


@pytest.fixture
def acme(live_api):
    with openai.OpenAI(base_url=live_api.url + "/v1", api_key="acme-key", max_retries=0, timeout=60) as client:
        yield client


def chat_line(i: int) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"s3-{i}"}], "max_tokens": 4}
    return json.dumps({"custom_id": f"s3-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}).encode()


def test_upload_content_batch_and_delete_go_through_s3(acme, live_api, rt, s3_client, bucket):
    data = b"\n".join(chat_line(i) for i in range(3))  # no final newline: still 3 lines
    f = acme.files.create(file=("in.jsonl", data), purpose="batch")
    (obj,) = s3_client.list_objects_v2(Bucket=bucket, Prefix="tidal/")["Contents"]
    assert obj["Size"] == len(data) == f.bytes
    assert s3_client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read() == data
    with httpx.stream(
        "GET", f"{live_api.url}/v1/files/{f.id}/content", headers={"Authorization": "Bearer acme-key"}
    ) as r:
        assert r.status_code == 200 and r.headers["content-length"] == str(len(data))
        assert b"".join(r.iter_bytes()) == data

    batch = acme.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert (batch.status, batch.request_counts.total) == ("in_progress", 3)  # validated from S3, inline
    with rt.store.read() as s:
        assert s.scalar(select(func.count()).select_from(Item).where(Item.batch_id == batch.id)) == 3

    acme.files.delete(f.id)
    assert everything(rt.blobs) == []


def test_refused_uploads_leave_nothing_in_the_bucket(acme, rt):
    too_many = b"\n".join(chat_line(i) for i in range(11))
    with pytest.raises(openai.BadRequestError) as e:
        acme.files.create(file=("in.jsonl", too_many), purpose="batch")
    assert e.value.code == "too_many_lines"
    # Past one part: the first part went up before the limit was reached, so the multipart upload is aborted.
    with pytest.raises(openai.APIStatusError) as e:
        acme.files.create(file=("big.bin", os.urandom(PART_BYTES + PART_BYTES // 2 + 1)), purpose="user_data")
    assert (e.value.status_code, e.value.code) == (413, "file_too_large")
    assert everything(rt.blobs) == []
