"""An engine answer past TIDAL_MAX_RESPONSE_BYTES is read through but never held: an error line, its usage recorded."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from tests.support.worker_helpers import settled
from tidal_workers.execute import TAIL_BYTES
from tidal_workers.execute import read_capped
from tidal_workers.execute import usage_in_tail
from tidal_workers.policy.pricing import Usage
from tidal_workers.store.models import Item

CAP = 64 * 1024


@pytest.fixture
def settings(settings):
    return settings.replace(max_response_bytes=CAP)


def test_an_answer_past_the_cap_is_an_error_line_with_its_usage_recorded(rt, make_batch, worker, stub):
    batch = make_batch(3)
    stub.script("b0-1", "huge")  # 1 MB, 16 times the cap
    with worker():
        b, out, err = settled(rt, batch)
    assert (b.completed, b.failed) == (2, 1)
    (big,) = err
    assert big["custom_id"] == "b0-1" and big["response"] is None
    assert big["error"]["code"] == "response_too_large" and "TIDAL_MAX_RESPONSE_BYTES" in big["error"]["message"]
    assert stub.seen("b0-1") == 1  # an error line, not a retry: the engine's work is done
    with rt.store.read() as s:
        row = s.scalars(select(Item).where(Item.batch_id == batch, Item.custom_id == "b0-1")).one()
    assert (row.input_tokens, row.output_tokens) == (7, 3)  # the usage the answer ended with, on the item's row
    assert (b.input_tokens, b.output_tokens) == (2 * 7, 2 * 3)  # billed: the completed items alone, as ever
    assert all(line["response"]["body"]["usage"]["prompt_tokens"] == 7 for line in out)


def test_read_capped_keeps_the_whole_answer_up_to_the_cap_and_only_the_tail_past_it():
    chunks = [b"a" * 1000, b"b" * 1000, b"c" * 1000]
    assert read_capped(chunks, 3000) == (b"a" * 1000 + b"b" * 1000 + b"c" * 1000, b"", 3000)
    raw, tail, size = read_capped(chunks, 2500)
    assert (raw, tail, size) == (None, b"a" * 1000 + b"b" * 1000 + b"c" * 1000, 3000)
    raw, tail, size = read_capped([b"x" * TAIL_BYTES] * 4, TAIL_BYTES)
    assert raw is None and len(tail) == TAIL_BYTES and size == 4 * TAIL_BYTES


def test_usage_is_read_from_the_end_of_a_truncated_answer():
    usage = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    answer = json.dumps({"choices": [{"text": "x" * 100}], "usage": usage}).encode()
    assert usage_in_tail(answer[-90:]) == Usage.from_response(usage)
    assert usage_in_tail(answer[-20:]) == Usage()  # cut inside the usage: none, never a wrong one
    assert usage_in_tail(b"no usage here") == Usage()
