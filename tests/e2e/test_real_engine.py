"""A batch through a real worker into the real vLLM-CPU engine: the engine's answers, usage and priority."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.support.worker_helpers import QUICK
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import settled
from tidal_workers.store.models import Item

pytestmark = pytest.mark.engine


@pytest.fixture
def settings(settings, tiny_engine):
    return settings.replace(**QUICK).replace(
        vllm_url=tiny_engine.url, gate_mode="aimd", request_timeout_seconds=120.0, initial_inflight=2
    )


def test_batch_completes_on_the_real_engine(rt, make_batch, worker, tiny_engine):
    batch = make_batch(6, priority=42, model=tiny_engine.model, max_tokens=8)
    with worker():
        b, out, err = settled(rt, batch)
    assert (b.completed, b.failed, err) == (6, 0, [])
    assert_exactly_once(rt, batch, out, err)
    body = out[0]["response"]["body"]
    assert out[0]["response"]["status_code"] == 200 and body["object"] == "chat.completion"
    assert body["model"] == tiny_engine.model and body["usage"]["completion_tokens"] >= 1
    with rt.store.read() as s:
        usage = s.execute(select(Item.input_tokens, Item.output_tokens).where(Item.batch_id == batch)).all()
    assert all(i > 0 and o > 0 for i, o in usage)
    assert b.input_tokens == sum(i for i, _ in usage) and b.output_tokens == sum(o for _, o in usage)
