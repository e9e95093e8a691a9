"""Ingest on a real store: items in prefix order, failures recorded, idempotent under redelivery."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func
from sqlalchemy import select
from workers.worker_helpers import queued
from workers.worker_helpers import validating_batch

from tidal_workers.ingest import ingest_batch
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import Item

CHAT = "/v1/chat/completions"


@pytest.fixture
def settings(settings):
    return settings.replace(models="tiny")


def _line(custom_id: str, model: str = "tiny", content: str = "hi") -> bytes:
    return (
        json.dumps(
            {
                "custom_id": custom_id,
                "method": "POST",
                "url": CHAT,
                "body": {"model": model, "messages": [{"role": "user", "content": content}]},
            }
        ).encode()
        + b"\n"
    )


def _state(rt, batch_id):
    with rt.store.read() as s:
        b = s.get(Batch, batch_id)
        n = s.scalar(select(func.count()).select_from(Item).where(Item.batch_id == batch_id))
    return b, n


def test_redelivery_inserts_nothing_twice(rt):
    batch_id = validating_batch(rt, b"".join(_line(str(i)) for i in range(10)))
    ingest_batch(rt, batch_id)
    ingest_batch(rt, batch_id)  # a redelivered Celery message
    b, n = _state(rt, batch_id)
    assert (b.status, b.total, b.model, n) == ("in_progress", 10, "tiny", 10)
    assert queued(rt, batch_id) == 10  # handed to enqueue_batch once, queued once


def test_model_not_in_the_configured_list_fails_the_batch(rt):
    batch_id = validating_batch(rt, _line("1") + _line("2", model="gpt-9"))
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, n) == ("failed", 0) and b.failed_at is not None
    assert b.errors == [
        {
            "code": "model_not_found",
            "line": 2,
            "param": "body.model",
            "message": "The provided model 'gpt-9' is not supported by the Batch API.",
        }
    ]


def test_input_deleted_before_ingest(rt):
    batch_id = validating_batch(rt, _line("1"))
    with rt.store.transaction() as s:
        f = s.get(File, s.get(Batch, batch_id).input_file_id)
        rt.blobs.delete(f.blob)
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, n, b.errors[0]["code"]) == ("failed", 0, "file_not_found")


def test_a_batch_no_longer_validating_is_left_alone(rt):
    batch_id = validating_batch(rt, _line("1"))
    with rt.store.transaction() as s:
        s.get(Batch, batch_id).status = "cancelled"
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, n) == ("cancelled", 0)


def test_fifty_thousand_lines(rt):
    """The largest allowed file goes in as bulk inserts (about 2 s on SQLite or PostgreSQL here)."""
    batch_id = validating_batch(rt, b"".join(_line(f"r{i}", content=f"prompt {i % 7}") for i in range(50_000)))
    ingest_batch(rt, batch_id)
    b, n = _state(rt, batch_id)
    assert (b.status, b.total, n) == ("in_progress", 50_000, 50_000) and queued(rt, batch_id) == 50_000
    with rt.store.read() as s:
        ordinals = s.scalars(select(Item.ordinal).where(Item.batch_id == batch_id).order_by(Item.line).limit(8)).all()
    # grouped by prompt: line 1 ("prompt 0") first, line 8 ("prompt 0" again) right after the other 7142 of its group
    assert ordinals[0] == 0 and ordinals[7] == 1
