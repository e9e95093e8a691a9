"""A batch on the real engine with S3 storage (moto's server over HTTP): a fleet's storage, end to end."""

from __future__ import annotations

import json

import httpx
import pytest
from celery.contrib.testing.worker import start_worker

from tests.support.storage_helpers import with_s3
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import upload_batch
from tidal_workers.celery_app import make_celery
from tidal_workers.store.models import File


@pytest.fixture
def settings(settings, s3_endpoint, bucket):
    return with_s3(settings, s3_endpoint, bucket)


@pytest.mark.engine
def test_a_batch_runs_on_the_real_engine_with_s3_storage(tiny_engine, live_api, rt, settings):
    """The worker validates nothing itself but finalizes: its output file goes to S3 and the API serves it."""
    worker_settings = settings.replace(
        vllm_url=tiny_engine.url, gate_mode="fixed", max_inflight=4, worker_threads=4, claim_idle_seconds=0.02
    )
    app = make_celery(worker_settings)
    batch_id = upload_batch(live_api.url, 4, model=tiny_engine.model, max_tokens=4, tag="s3e2e")
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING"):
        batch, out, err = settled(rt, batch_id, timeout=180)
    assert (batch.completed, len(out), err) == (4, 4, [])
    assert {line["response"]["status_code"] for line in out} == {200}
    r = httpx.get(
        f"{live_api.url}/v1/files/{batch.output_file_id}/content", headers={"Authorization": "Bearer acme-key"}
    )
    assert sorted(json.loads(x)["custom_id"] for x in r.text.splitlines()) == [f"s3e2e-{i}" for i in range(4)]
    with rt.store.read() as s:
        blob = s.get(File, batch.output_file_id).blob
    assert rt.blobs.read_bytes(blob) == r.content
