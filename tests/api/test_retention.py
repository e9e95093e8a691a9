"""Retention: expires_after / output_expires_after, the beat sweep that deletes expired files (bytes and row),
the purge of what items hold of a deleted or expired file, and the retention of finished batches' item rows."""

from __future__ import annotations

import json
import time

import openai
import pytest
from sqlalchemy import select
from sqlalchemy import update

from config.celery import celery_config
from tests.support.api_helpers import CHAT
from tests.support.api_helpers import jsonl
from tests.support.api_helpers import request_line
from tidal_workers import finalize
from tidal_workers import task_names
from tidal_workers.retention import PURGED
from tidal_workers.retention import sweep
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import Item

HOUR, DAY = 3600, 86_400
LINES = jsonl([request_line("a", "prompt a"), request_line("b", "prompt b"), request_line("c", "prompt c")])


@pytest.fixture
def settings(settings):
    return settings.replace(item_retention_seconds=DAY)


def _items(rt, batch_id: str) -> dict[str, Item]:
    with rt.store.read() as s:
        return {i.custom_id: i for i in s.scalars(select(Item).where(Item.batch_id == batch_id))}


def _settle(rt, batch_id: str, completed: list[str], failed: list[str]) -> None:
    """Write results for some items as the workers would, without an engine."""
    with rt.store.transaction() as s:
        for custom_id in completed:
            s.execute(
                update(Item)
                .where(Item.batch_id == batch_id, Item.custom_id == custom_id)
                .values(status="completed", response_status=200, request_id="r", response_body='{"answer": 1}')
            )
        for custom_id in failed:
            s.execute(
                update(Item)
                .where(Item.batch_id == batch_id, Item.custom_id == custom_id)
                .values(status="failed", response_status=400, response_body='{"e": 1}', error_message="bad")
            )
        s.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(completed=Batch.completed + len(completed), failed=Batch.failed + len(failed))
        )


def _file_row(rt, file_id: str) -> File | None:
    with rt.store.read() as s:
        return s.get(File, file_id)


def test_expires_after_sets_the_files_expiry_and_the_sweep_deletes_it_from_disk_and_sql(acme, rt):
    f = acme.files.create(
        file=("in.jsonl", LINES),
        purpose="batch",
        extra_body={"expires_after[anchor]": "created_at", "expires_after[seconds]": "7200"},
    )
    kept = acme.files.create(file=("keep.jsonl", LINES), purpose="user_data")
    assert f.expires_at == f.created_at + 2 * HOUR
    assert kept.expires_at == kept.created_at + rt.settings.file_expiry_seconds  # the default
    blob = _file_row(rt, f.id).blob
    assert (rt.blobs.root / blob).is_file()

    assert sweep(rt, now=f.created_at + 2 * HOUR - 1).expired_files == []  # not yet
    report = sweep(rt, now=f.created_at + 2 * HOUR)
    assert report.expired_files == [f.id] and report.freed_bytes == len(LINES)
    assert not (rt.blobs.root / blob).exists() and _file_row(rt, f.id) is None  # gone from disk and SQL
    with pytest.raises(openai.NotFoundError):
        acme.files.retrieve(f.id)
    assert [x.id for x in acme.files.list().data] == [kept.id]
    assert sweep(rt, now=f.created_at + 2 * HOUR).expired_files == []  # idempotent


def test_output_expires_after_applies_to_the_batch_files_and_their_expiry_purges_the_items(acme, rt):
    file_id = acme.files.create(file=("in.jsonl", LINES), purpose="batch").id
    b = acme.batches.create(
        input_file_id=file_id,
        endpoint=CHAT,
        completion_window="24h",
        extra_body={"output_expires_after": {"anchor": "created_at", "seconds": HOUR}},
    )
    _settle(rt, b.id, completed=["a", "b"], failed=["c"])
    assert finalize.perform_finalize(rt, b.id)
    done = acme.batches.retrieve(b.id)
    out, err = acme.files.retrieve(done.output_file_id), acme.files.retrieve(done.error_file_id)
    assert out.expires_at == out.created_at + HOUR and err.expires_at == err.created_at + HOUR
    assert acme.files.content(out.id).read().count(b"\n") == 2

    report = sweep(rt, now=out.created_at + HOUR)
    assert sorted(report.expired_files) == sorted([out.id, err.id]) and report.purged_items == 3
    items = _items(rt, b.id)
    assert all(i.response_body is None for i in items.values()) and items["c"].error_message is None
    assert all(i.body != PURGED for i in items.values())  # the input file has not expired: prompts stay
    assert _file_row(rt, out.id) is None and _file_row(rt, err.id) is None
    assert acme.batches.retrieve(b.id).output_file_id == out.id  # the batch still names its (gone) files


def test_deleting_an_input_file_purges_the_prompts_items_hold(acme, rt):
    file_id = acme.files.create(file=("in.jsonl", LINES), purpose="batch").id
    b = acme.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    _settle(rt, b.id, completed=["a"], failed=[])
    acme.files.delete(file_id)
    items = _items(rt, b.id)
    assert items["a"].body == PURGED  # settled: its prompt goes with the file
    assert json.loads(items["b"].body)["messages"][0]["content"] == "prompt b"  # pending: still needed to run
    _settle(rt, b.id, completed=["b", "c"], failed=[])
    assert sweep(rt).purged_items == 2  # once settled, the sweep purges the rest
    assert {i.body for i in _items(rt, b.id).values()} == {PURGED}


def test_finished_batches_lose_their_item_rows_after_the_retention_period(acme, rt):
    file_id = acme.files.create(file=("in.jsonl", LINES), purpose="batch").id
    running = acme.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    done = acme.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    _settle(rt, done.id, completed=["a", "b", "c"], failed=[])
    assert finalize.perform_finalize(rt, done.id)
    completed_at = acme.batches.retrieve(done.id).completed_at
    assert sweep(rt, now=completed_at + DAY - 1).deleted_items == 0
    assert sweep(rt, now=completed_at + DAY).deleted_items == 3
    assert _items(rt, done.id) == {} and len(_items(rt, running.id)) == 3  # open batches keep theirs
    after = acme.batches.retrieve(done.id)
    assert (after.status, after.request_counts.completed) == ("completed", 3)  # the row keeps its counts
    assert acme.files.content(after.output_file_id).read().count(b"\n") == 3  # and its output file its lines


def test_a_finished_batchs_metadata_and_errors_are_cleared_after_the_batch_retention(acme, rt):
    """Off by default; with TIDAL_BATCH_RETENTION_SECONDS what a tenant wrote into a finished batch (metadata) and
    its validation errors (which quote lines) are cleared that long after it finished, the row kept with its
    status, counts and files; an open batch keeps them (review L13)."""
    file_id = acme.files.create(file=("in.jsonl", LINES), purpose="batch").id
    running = acme.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h", metadata={"project": "open"}
    )
    done = acme.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h", metadata={"project": "secret"}
    )
    bad = acme.files.create(file=("bad.jsonl", b'{"custom_id": "quoted secret"}\n'), purpose="batch").id
    failed = acme.batches.create(input_file_id=bad, endpoint=CHAT, completion_window="24h")
    assert acme.batches.retrieve(failed.id).errors.data  # the validation error, quoting the line
    _settle(rt, done.id, completed=["a", "b", "c"], failed=[])
    assert finalize.perform_finalize(rt, done.id)
    done_at = acme.batches.retrieve(done.id).completed_at
    assert sweep(rt, now=done_at + 400 * DAY).cleared_batches == 0  # the default keeps them

    rt.settings = rt.settings.replace(batch_retention_seconds=30 * DAY)
    ended = (done_at, acme.batches.retrieve(failed.id).failed_at)
    assert sweep(rt, now=min(ended) + 30 * DAY - 1).cleared_batches == 0
    assert sweep(rt, now=max(ended) + 30 * DAY).cleared_batches == 2
    after = acme.batches.retrieve(done.id)
    assert (after.metadata, after.status, after.request_counts.completed) == (None, "completed", 3)
    assert after.output_file_id is not None
    gone = acme.batches.retrieve(failed.id)
    assert (gone.status, gone.errors) == ("failed", None)
    assert acme.batches.retrieve(running.id).metadata == {"project": "open"}  # open batches keep theirs
    assert sweep(rt, now=done_at + 400 * DAY).cleared_batches == 0  # once


def test_beat_runs_the_retention_sweep():
    from config import load_settings

    schedule = celery_config(load_settings(retention_seconds=120.0))["beat_schedule"]["tidal-retention"]
    assert schedule["task"] == task_names.SWEEP_RETENTION == "tidal.sweep.retention"
    assert schedule["schedule"] == 120.0 and schedule["options"]["queue"] == task_names.OPS_QUEUE


def test_a_deleted_file_keeps_a_tombstone_for_cursors_until_it_expires(acme, rt):
    first = acme.files.create(file=("1.jsonl", LINES), purpose="batch")
    second = acme.files.create(file=("2.jsonl", LINES), purpose="batch")
    acme.files.delete(second.id)
    assert [f.id for f in acme.files.list(after=second.id).data] == [first.id]  # the cursor still works
    sweep(rt, now=time.time() + rt.settings.file_expiry_seconds + 1)
    assert _file_row(rt, second.id) is None and _file_row(rt, first.id) is None
