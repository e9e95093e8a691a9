"""The issue's flood: one tenant uploads one file and asks for 1,000 batches from it. The open-batch quota refuses
all but the first few, with 429 and OpenAI's envelope, and nothing of a refused batch is stored or queued."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import func
from sqlalchemy import select

from tests.support.api_helpers import CHAT
from tests.support.api_helpers import error_of
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line
from tidal_workers import finalize
from tidal_workers import keys
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item

OPEN_BATCHES = 5
LINES = 3
LINES_FILE = jsonl([request_line(f"r{i}", f"hello {i}", max_tokens=16) for i in range(LINES)])


@pytest.fixture
def settings(settings):
    return settings.replace(tenant_limits=json.dumps({"acme": {"open_batches": OPEN_BATCHES}}))


def _create(http: httpx.Client, file_id: str) -> httpx.Response:
    return http.post("/v1/batches", json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"})


def _upload(http: httpx.Client, content: bytes) -> httpx.Response:
    return http.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})


def test_a_1000_batch_flood_is_refused_at_the_quota_with_nothing_enqueued(http, rt, live_api):
    file_id = _upload(http, LINES_FILE).json()["id"]
    answers = [_create(http, file_id) for _ in range(1000)]
    accepted = [r.json()["id"] for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code != 200]
    assert len(accepted) == OPEN_BATCHES and len(refused) == 1000 - OPEN_BATCHES
    assert {r.status_code for r in refused} == {429}
    err = error_of(refused[-1])
    assert err["code"] == "batch_limit_exceeded" and f"Limit: {OPEN_BATCHES:,} batches" in err["message"]
    with rt.store.read() as s:
        assert s.scalar(select(func.count()).select_from(Batch)) == OPEN_BATCHES
        assert s.scalar(select(func.count()).select_from(Item)) == OPEN_BATCHES * LINES
    assert sorted(rt.queue.queued_batches()) == sorted(accepted)
    assert sum(rt.redis.zcard(keys.ready(b)) for b in accepted) == OPEN_BATCHES * LINES
    # the quota is on open batches: one cancelled, one more may start
    assert http.post(f"/v1/batches/{accepted[0]}/cancel").status_code == 200
    assert finalize.perform_finalize(rt, accepted[0])  # the ops worker closes it (nothing in flight): cancelled
    assert _create(http, file_id).status_code == 200
    assert _create(http, file_id).status_code == 429
    # another tenant has quotas of its own
    globex = httpx.Client(base_url=live_api.url, headers={"Authorization": "Bearer globex-key"}, timeout=30)
    with globex:
        assert _create(globex, _upload(globex, LINES_FILE).json()["id"]).status_code == 200
