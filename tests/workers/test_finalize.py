"""Finalize's files: engine bodies spliced in as recorded, items fetched in groups bounded in bytes as in rows; a
batch whose files cannot be written fails after its attempts (issue 37 item 1, review H1), never looping."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
from sqlalchemy import select
from sqlalchemy import update

from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import file_lines
from tests.support.worker_helpers import item_ids
from tidal_api.metrics import StoreCollector
from tidal_api.serialize import batch_object
from tidal_workers import finalize
from tidal_workers.quotas import lock_tenant
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus
from tidal_workers.sweeps import reconcile


def answer(rt, batch_id: str, bodies: list[str]) -> None:
    """Record each item's answer as the result write would: completed, 200, the engine's text, counted."""
    with rt.store.transaction() as s:
        for item_id, body in zip(item_ids(rt, batch_id), bodies, strict=True):
            s.execute(
                update(Item)
                .where(Item.id == item_id)
                .values(
                    status=ItemStatus.completed.value, response_status=200, request_id=f"r{item_id}", response_body=body
                )
            )
        s.execute(update(Batch).where(Batch.id == batch_id).values(completed=len(bodies)))


def test_a_body_is_spliced_in_as_the_engine_wrote_it_never_parsed_again(rt, make_batch):
    batch = make_batch(2, enqueue=False)
    pretty = json.dumps({"object": "chat.completion", "usage": {"total_tokens": 3}}, indent=2)  # line breaks inside
    answer(rt, batch, ['{"score": 1.10, "text": "a\\nb"}', pretty])
    assert finalize.perform_finalize(rt, batch)
    raw = rt.blobs.read_bytes(_output_blob(rt, batch)).decode()
    assert '"body": {"score": 1.10, "text": "a\\nb"}' in raw  # 1.10 kept: a parse and re-dump would write 1.1
    lines = file_lines(rt, batch_row(rt, batch).output_file_id)
    assert [line["response"]["body"] for line in lines] == [{"score": 1.1, "text": "a\nb"}, json.loads(pretty)]
    assert [line["custom_id"] for line in lines] == ["b0-0", "b0-1"]


def test_unicode_line_breaks_in_a_body_are_escaped_so_any_line_reader_sees_one_line_per_item(rt, make_batch):
    """vLLM writes U+0085, U+2028 and U+2029 raw inside a JSON string; ``str.splitlines`` cuts there, and a CI run's
    output file (a random-weight model's text) once read as a cut, unparseable line."""
    batch = make_batch(2, enqueue=False)
    text = "a\x85b\u2028c\u2029d"
    answer(rt, batch, [json.dumps({"text": text}, ensure_ascii=False), '{"text": "plain"}'])
    assert finalize.perform_finalize(rt, batch)
    raw = rt.blobs.read_bytes(_output_blob(rt, batch)).decode()
    assert len(raw.splitlines()) == 2 and "\\u2028" in raw
    assert [line["response"]["body"]["text"] for line in file_lines(rt, batch_row(rt, batch).output_file_id)] == [
        text,
        "plain",
    ]


def test_a_lines_id_tells_nothing_of_the_fleet_and_is_the_same_at_every_attempt(rt, make_batch):
    """``batch_req_`` ids were the item's row id, which counts every tenant's items (review L8); now a hash of the
    batch's id and the line, so two finalizes of the same batch write the same ids."""
    batch = make_batch(3, enqueue=False)
    answer(rt, batch, ["{}"] * 3)
    assert finalize.perform_finalize(rt, batch)
    ids = [line["id"] for line in file_lines(rt, batch_row(rt, batch).output_file_id)]
    assert len(set(ids)) == 3 and all(i.startswith("batch_req_") and len(i) == len("batch_req_") + 24 for i in ids)
    assert not {f"batch_req_{item_id}" for item_id in item_ids(rt, batch)} & set(ids)
    with rt.store.read() as s:
        items = s.scalars(select(Item).where(Item.batch_id == batch).order_by(Item.line)).all()
    assert [finalize.request_id_of(item) for item in items] == ids


def test_items_are_fetched_in_groups_bounded_by_their_bodies_length(rt, make_batch, monkeypatch):
    batch = make_batch(7, enqueue=False)
    bodies = [json.dumps({"n": i, "pad": "x" * (100 * i)}) for i in range(7)]
    answer(rt, batch, bodies)
    fetched: list[list[int]] = []
    groups = finalize.fetch_groups

    def recorded(sizes, max_chars, max_rows):
        for ids in groups(sizes, max_chars, max_rows):
            fetched.append(ids)
            yield ids

    monkeypatch.setattr(finalize, "FETCH_CHARS", 700)
    monkeypatch.setattr(finalize, "fetch_groups", recorded)
    assert finalize.perform_finalize(rt, batch)
    lines = file_lines(rt, batch_row(rt, batch).output_file_id)
    assert [line["response"]["body"]["n"] for line in lines] == list(range(7))  # every line, in order
    ids = item_ids(rt, batch)
    assert fetched == [ids[:4], ids[4:5], ids[5:6], ids[6:]]  # bodies of ~20+120+220+320 chars, then 420, 520, 620


def test_fetch_groups_bound_rows_and_chars_and_keep_an_oversized_body_alone():
    sizes = [(1, 10), (2, 10), (3, 100), (4, 5), (5, 5), (6, 5)]
    assert list(finalize.fetch_groups(sizes, 30, 2)) == [[1, 2], [3], [4, 5], [6]]
    assert list(finalize.fetch_groups(sizes, 1000, 10)) == [[1, 2, 3, 4, 5, 6]]
    assert list(finalize.fetch_groups([], 10, 10)) == []


def _output_blob(rt, batch_id: str) -> str:
    from tidal_workers.store.models import File

    with rt.store.read() as s:
        return s.get(File, batch_row(rt, batch_id).output_file_id).blob


def break_blobs(rt) -> None:
    """The blob store refuses every write (its folder is a file now): each finalize attempt raises."""
    shutil.rmtree(rt.blobs.root)
    rt.blobs.root.write_text("not a folder")


def attempts_of(rt, batch_id: str) -> int:
    return batch_row(rt, batch_id).finalize_attempts


def unwritten(rt) -> float:
    """The API's ``tidal_finalize_failed_batches_total``, read from SQL at scrape time."""
    (metric,) = [m for m in StoreCollector(rt.store).collect() if m.name == "tidal_finalize_failed_batches"]
    return metric.samples[0].value


def test_a_batch_whose_files_cannot_be_written_fails_after_its_attempts_and_keeps_its_results(rt, make_batch):
    assert rt.settings.finalize_attempts == 5  # the default
    batch = make_batch(2, enqueue=False)
    answer(rt, batch, ['{"n": 0}', '{"n": 1}'])
    break_blobs(rt)
    failed_before = unwritten(rt)
    with pytest.raises(OSError):
        finalize.perform_finalize(rt, batch)  # the item task's request: the first attempt
    since = batch_row(rt, batch).finalizing_at
    assert (batch_row(rt, batch).status, attempts_of(rt, batch)) == ("finalizing", 1)
    r = rt.settings.reconcile_seconds
    for attempts in range(1, 5):  # reconcile's retries, each later than the one before: +R, +3R, +7R, +15R
        due = since + r * (2**attempts - 1)
        reconcile(rt, now=due - 1)
        assert attempts_of(rt, batch) == attempts  # not yet due: no attempt
        reconcile(rt, now=due)  # the attempt raises; reconcile logs it and goes on
        assert (batch_row(rt, batch).status, attempts_of(rt, batch)) == ("finalizing", attempts + 1)
    reconcile(rt, now=since + 31 * r)  # the attempts are used up: the batch fails, no sixth attempt
    b = batch_row(rt, batch)
    assert (b.status, b.finalize_attempts, b.output_file_id, b.error_file_id) == ("failed", 5, None, None)
    assert b.failed_at and b.finalizing_at == since
    client = batch_object(b, rt.settings, None)  # what GET /v1/batches/{id} answers
    assert client["status"] == "failed" and client["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    (error,) = client["errors"]["data"]
    assert error["code"] == "finalize_failed" and "5 attempts failed" in error["message"]
    with rt.store.read() as s:  # nothing already written is lost
        kept = s.execute(select(Item.status, Item.response_body).where(Item.batch_id == batch)).all()
    assert sorted(kept) == [("completed", '{"n": 0}'), ("completed", '{"n": 1}')]
    assert unwritten(rt) == failed_before + 1
    reconcile(rt, now=since + 1000 * r)
    assert batch_row(rt, batch).status == "failed" and attempts_of(rt, batch) == 5  # never tried again


def test_a_fault_that_passes_costs_only_the_attempts_it_lasted(rt, make_batch):
    batch = make_batch(1, enqueue=False)
    answer(rt, batch, ['{"n": 0}'])
    break_blobs(rt)
    with pytest.raises(OSError):
        finalize.perform_finalize(rt, batch)
    since, r = batch_row(rt, batch).finalizing_at, rt.settings.reconcile_seconds
    reconcile(rt, now=since + r)
    assert attempts_of(rt, batch) == 2
    rt.blobs.root.unlink()
    rt.blobs.root.mkdir()  # the blob store is back
    reconcile(rt, now=since + 3 * r)
    b = batch_row(rt, batch)
    assert (b.status, b.finalize_attempts) == ("completed", 3) and b.errors is None
    assert [line["response"]["body"] for line in file_lines(rt, b.output_file_id)] == [{"n": 0}]


@pytest.fixture
def paused_write(rt, monkeypatch):
    """The first file finalize writes stops after its first line until ``resume`` is set: (reached, resume)."""
    reached, resume = threading.Event(), threading.Event()
    write_lines = rt.blobs.write_lines

    def paused(lines):
        def held():
            for n, one in enumerate(lines):
                if n == 1 and not reached.is_set():
                    reached.set()
                    assert resume.wait(60), "the test never resumed the write"
                yield one

        return write_lines(held())

    monkeypatch.setattr(rt.blobs, "write_lines", paused)
    yield reached, resume
    resume.set()


def _in_thread(fn, *args) -> tuple[threading.Thread, list]:
    """Run ``fn(*args)`` in a thread; the list gets its return value."""
    returned: list = []
    thread = threading.Thread(target=lambda: returned.append(fn(*args)), daemon=True)
    thread.start()
    return thread, returned


def test_a_writer_is_not_held_up_while_finalize_writes_the_files(rt, make_batch, paused_write):
    """The files are written before the electing transaction (review L7): on SQLite a write elsewhere (here a
    create's quota transaction) commits while a file is half written, not once it is done."""
    reached, resume = paused_write
    batch = make_batch(3, enqueue=False)
    answer(rt, batch, ['{"n": 0}', '{"n": 1}', '{"n": 2}'])
    finalizing, done = _in_thread(finalize.perform_finalize, rt, batch)
    assert reached.wait(30), "finalize never wrote its output file"
    committed = threading.Event()

    def create() -> None:
        with rt.store.transaction() as s:
            lock_tenant(s, "acme")
        committed.set()

    writer, _ = _in_thread(create)
    mid_write = committed.wait(5)
    resume.set()
    finalizing.join(60)
    writer.join(60)
    assert mid_write, "the write waited for finalize's files"
    b = batch_row(rt, batch)
    assert done == [True] and b.status == "completed" and b.error_file_id is None
    assert [line["response"]["body"]["n"] for line in file_lines(rt, b.output_file_id)] == [0, 1, 2]


def test_a_finalize_that_loses_the_election_deletes_its_blobs(rt, make_batch, paused_write):
    reached, resume = paused_write
    batch = make_batch(2, enqueue=False)
    answer(rt, batch, ['{"n": 0}', '{"n": 1}'])
    with rt.store.transaction() as s:
        s.execute(update(Batch).where(Batch.id == batch).values(status="finalizing"))
    first, won = _in_thread(finalize.finish_finalizing, rt, batch)
    assert reached.wait(30), "finalize never wrote its output file"
    assert finalize.finish_finalizing(rt, batch)  # reconcile's attempt, beside the first (it looked dead)
    resume.set()
    first.join(60)
    b = batch_row(rt, batch)
    assert (won, b.status) == ([False], "completed")
    assert sorted(p.name for p in rt.blobs.root.iterdir()) == [_output_blob(rt, batch)]  # no orphan left


def _answer_one(rt, batch_id: str, n: int) -> None:
    """Item ``n``'s answer, recorded as the result write does (only while it is pending)."""
    with rt.store.transaction() as s:
        s.execute(
            update(Item)
            .where(Item.id == item_ids(rt, batch_id)[n], Item.status == ItemStatus.pending.value)
            .values(
                status=ItemStatus.completed.value, response_status=200, request_id="r", response_body=f'{{"n": {n}}}'
            )
        )
        s.execute(update(Batch).where(Batch.id == batch_id).values(completed=Batch.completed + 1))


def test_an_expiry_whose_items_settle_while_its_files_are_written_writes_them_again(rt, make_batch, paused_write):
    """Pending items become batch_expired lines in files written before the transaction; an item that settles
    meanwhile makes them stale, so they are written again and the lines match SQL."""
    reached, resume = paused_write
    batch = make_batch(3, enqueue=False)
    _answer_one(rt, batch, 0)
    expiring, expired = _in_thread(finalize.expire, rt, batch)
    assert reached.wait(30), "finalize never wrote a file"
    _answer_one(rt, batch, 1)  # a result lands mid-write
    resume.set()
    expiring.join(60)
    b = batch_row(rt, batch)
    assert (expired, b.status) == ([True], "expired")
    assert [line["response"]["body"]["n"] for line in file_lines(rt, b.output_file_id)] == [0, 1]
    assert [line["error"]["code"] for line in file_lines(rt, b.error_file_id)] == ["batch_expired"]
    assert len(list(rt.blobs.root.iterdir())) == 2  # the stale files' blobs are gone
