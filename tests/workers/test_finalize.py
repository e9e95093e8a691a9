"""Finalize's files: engine bodies spliced in as recorded, items fetched in groups bounded in bytes as in rows."""

from __future__ import annotations

import json

from sqlalchemy import update

from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import file_lines
from tests.support.worker_helpers import item_ids
from tidal_workers import finalize
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus


def answer(rt, batch_id: str, bodies: list[str]) -> None:
    """Record each item's answer as the result write would: completed, 200, the engine's text."""
    with rt.store.transaction() as s:
        for item_id, body in zip(item_ids(rt, batch_id), bodies, strict=True):
            s.execute(
                update(Item)
                .where(Item.id == item_id)
                .values(
                    status=ItemStatus.completed.value, response_status=200, request_id=f"r{item_id}", response_body=body
                )
            )


def test_a_body_is_spliced_in_as_the_engine_wrote_it_never_parsed_again(rt, make_batch):
    batch = make_batch(2, enqueue=False)
    pretty = json.dumps({"object": "chat.completion", "usage": {"total_tokens": 3}}, indent=2)  # line breaks inside
    answer(rt, batch, ['{"score": 1.10, "text": "a\\nb"}', pretty])
    assert finalize.complete(rt, batch)
    raw = rt.blobs.read_bytes(_output_blob(rt, batch)).decode()
    assert '"body": {"score": 1.10, "text": "a\\nb"}' in raw  # 1.10 kept: a parse and re-dump would write 1.1
    lines = file_lines(rt, batch_row(rt, batch).output_file_id)
    assert [line["response"]["body"] for line in lines] == [{"score": 1.1, "text": "a\nb"}, json.loads(pretty)]
    assert [line["custom_id"] for line in lines] == ["b0-0", "b0-1"]


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
    assert finalize.complete(rt, batch)
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
