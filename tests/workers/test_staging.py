"""Staged prefill through a real Celery worker and the stub engine (tests/support/stub_engine.py): the warm-ups'
order and fields, and a failed warm-up, which the real engine cannot make on demand. That the engine's steps then
compute one chunk at most is tests/e2e/test_staging_real_engine.py's."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import REGISTRY

from tests.support.stub_engine import WARMUP
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import settled
from tidal_workers.execute import cache_salt
from tidal_workers.own_requests import OWN

CHUNK = 1  # tokens a warm-up adds: the stub's tokens are the key's characters, "b0-0" four of them


@pytest.fixture
def settings(settings):
    return settings.replace(prefill_stage_tokens=CHUNK, prefill_stage_min_tokens=0)


def test_an_item_s_prompt_is_warmed_a_chunk_a_request_with_its_priority_and_salt_then_sent(
    rt, make_batch, worker, stub, settings
):
    batch = make_batch(1, priority=37, tenant="acme")
    tokens_before = REGISTRY.get_sample_value("tidal_prefill_stage_tokens_total") or 0.0
    own_before = OWN.totals()
    with worker():
        b, out, err = settled(rt, batch)
    assert (b.completed, b.failed, err) == (1, 0, [])
    assert_exactly_once(rt, batch, out, err)
    assert [body["messages"] for body in stub.tokenized] == [[{"role": "user", "content": "b0-0"}]]
    salt = cache_salt(settings.cache_salt_secret, "acme")
    warmups = [body for body in stub.requests if "prompt" in body]
    assert warmups == [
        {"model": "m", "prompt": list(range(n)), "max_tokens": 1, "priority": 37, "cache_salt": salt} for n in (1, 2, 3)
    ]
    assert stub.requests[-1]["messages"][0]["content"] == "b0-0"  # the item itself, after its warm-ups
    assert stub.requests[-1]["cache_salt"] == salt
    # what the frontier takes out of the engine's counters (frontier.batch_samples): the warm-ups' prompt tokens
    assert REGISTRY.get_sample_value("tidal_prefill_stage_tokens_total") - tokens_before == 1 + 2 + 3
    # what the latency gate takes out of the engine's finished requests (own_requests.py): three warm-ups, one token
    # each, new a token each; the item (the stub's usage: 7 prompt tokens, 3 generated), 4 of its prompt not warmed;
    # and out of its first tokens: four requests sent
    own = OWN.totals()
    moved = [a - b for a, b in zip(dataclasses.astuple(own), dataclasses.astuple(own_before), strict=True)]
    assert moved == [4, 1 + 2 + 3 + 7, 3 + 3, 3 + 4, 1, 7, 3, 4]


class TestTheFloor:
    @pytest.fixture
    def settings(self, settings):
        return settings.replace(prefill_stage_min_tokens=4)  # "b0-0": four tokens, the floor's own length

    def test_a_prompt_at_or_under_the_floor_is_tokenized_and_then_sent_whole(self, rt, make_batch, worker, stub):
        batch = make_batch(1)
        own_before = OWN.totals()
        with worker():
            b, out, err = settled(rt, batch)
        assert (b.completed, b.failed, err) == (1, 0, [])
        assert_exactly_once(rt, batch, out, err)
        assert len(stub.tokenized) == 1
        assert [body for body in stub.requests if "prompt" in body] == []  # no warm-up
        own = OWN.totals()
        # one request sent; the stub's usage: 7 prompt tokens, all computed by the item itself
        assert (own.sent - own_before.sent, own.computed_tokens - own_before.computed_tokens) == (1, 7)


def test_a_failed_warm_up_ends_the_staging_and_the_item_goes_whole_with_no_retry_spent(rt, make_batch, worker, stub):
    batch = make_batch(1)
    stub.script(WARMUP, "500")
    with worker():
        b, out, err = settled(rt, batch)
    assert (b.completed, b.failed, err) == (1, 0, [])
    assert_exactly_once(rt, batch, out, err)
    assert stub.seen(WARMUP) == 1 and stub.seen("b0-0") == 1  # no second warm-up; the item sent once
