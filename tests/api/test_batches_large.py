"""A batch whose input file is over TIDAL_SYNC_VALIDATE_BYTES is validated by the `tidal.ingest` Celery task."""

from __future__ import annotations

import base64
import json
import time

import pytest

from tests.support.api_helpers import CHAT
from tests.support.api_helpers import error_of
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line
from tidal_workers.ingest import ingest_batch
from tidal_workers.sweeps import reconcile


@pytest.fixture
def settings(settings):
    return settings.replace(sync_validate_bytes=0)


def test_create_answers_validating_and_sends_the_ingest_task(acme, batch_file, rt):
    b = acme.batches.create(
        input_file_id=batch_file([request_line("1"), request_line("2")]), endpoint=CHAT, completion_window="24h"
    )
    assert b.status == "validating" and b.in_progress_at is None and b.request_counts.total == 0
    # the message is in the broker's tidal.ingest list, as a worker will receive it
    raw = rt.redis.rpop("tidal.ingest")
    assert raw is not None and rt.redis.llen("tidal.ingest") == 0
    message = json.loads(raw)
    assert message["headers"]["task"] == "tidal.ingest"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert (args, kwargs) == ([b.id], {})
    ingest_batch(rt, *args)  # what the task does
    after = acme.batches.retrieve(b.id)
    assert (after.status, after.request_counts.total, after.model) == ("in_progress", 2, "tiny")


def test_a_broker_that_is_down_loses_nothing_and_reconcile_resends_the_ingest(acme, batch_file, rt, settings):
    """The batch row is the record that ingest is owed: the create answers, and a later reconcile sends the task."""
    up = rt.settings
    rt.settings = settings.replace(broker_url="redis://127.0.0.1:1/0")  # nothing listens on port 1
    rt.__dict__.pop("celery", None)  # the Celery app is built lazily from the settings
    b = acme.batches.create(input_file_id=batch_file([request_line("1")]), endpoint=CHAT, completion_window="24h")
    assert b.status == "validating" and rt.redis.llen("tidal.ingest") == 0

    rt.settings = up
    rt.__dict__.pop("celery", None)
    reconcile(rt, now=time.time() + 60)  # too soon: the batch may still be on its way through a slow broker
    assert rt.redis.llen("tidal.ingest") == 0
    reconcile(rt, now=time.time() + settings.ingest_resend_seconds)
    message = json.loads(rt.redis.rpop("tidal.ingest"))
    assert message["headers"]["task"] == "tidal.ingest"
    args, _, _ = json.loads(base64.b64decode(message["body"]))
    ingest_batch(rt, *args)
    assert acme.batches.retrieve(b.id).status == "in_progress"


def test_a_second_batch_on_a_file_still_validating_is_refused_until_the_first_has_left_validating(
    acme, globex, batch_file, http, rt
):
    """100 batches on one 200 MB file would be 100 ingests of it: while one validates it, another is a 409."""
    file_id = batch_file([request_line("1"), request_line("2")])
    first = acme.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
    r = http.post("/v1/batches", json=body)
    assert r.status_code == 409
    assert error_of(r) == {
        "message": f"File {file_id} is still being validated for batch {first.id}. Create another batch on it once "
        "that one has left 'validating'.",
        "type": "invalid_request_error",
        "param": "input_file_id",
        "code": "input_file_in_use",
    }
    assert rt.redis.llen("tidal.ingest") == 1  # the first batch's ingest only
    assert [b.id for b in acme.batches.list()] == [first.id]  # nothing stored for the refused one
    # another tenant's batches are not its business (and that file is not theirs to name)
    other = globex.files.create(file=("in.jsonl", jsonl([request_line("1")])), purpose="batch").id
    assert globex.batches.create(input_file_id=other, endpoint=CHAT, completion_window="24h").status == "validating"

    ingest_batch(rt, first.id)  # what the task does
    # validated: as OpenAI allows, another batch may run the same file
    second = acme.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    assert second.status == "validating" and acme.batches.retrieve(first.id).status == "in_progress"
