"""Online pressure is never missed on a stock engine: with all 20 of the node's batch requests running, one
online request queued reads as one online waiting, and none queued as zero (issue 17).

A real vLLM engine with exactly 20 slots, a real worker holding 20 requests there (fixed target 20), and the
gate's own reading of the engine's /metrics with the node's O. Every step waits for the engine's states; nothing
is timed. The engine is the timed twin (A6000 profile): a decode step takes the GPU's ~25 ms whatever the machine's
load, so each 1,000-token request runs for at least 25 s, longer than the worker takes to post all 20 on a loaded
machine. On the tiny CPU engine a request alone finished in about a second and, under load, the first requests
could end before the last were posted, so "all 20 running" never came.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests
from prometheus_client import REGISTRY

from config import load_settings
from tests.support.wait import wait_for
from tests.support.worker_helpers import QUICK
from tests.support.worker_helpers import settled
from tidal_workers.gate import parse_metrics
from tidal_workers.scrape import fetch

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SLOTS = OURS = 20
LONG = 1000  # tokens each batch request generates (ignore_eos): they run for many steps after the checks
PROFILE = "qwen2.5-7b@a6000"


@pytest.fixture(scope="module")
def engine_20(tmp_path_factory):
    """The twin on a stock scheduler with exactly 20 slots and the GPU's KV pool (room for all of them)."""
    from tidal_engine.serve import start_twin

    log_path = tmp_path_factory.mktemp("engine-20") / "vllm.log"
    engine = start_twin(load_settings(), PROFILE, log_path=log_path, max_num_seqs=SLOTS, max_model_len=2048)
    yield engine
    engine.stop()


@pytest.fixture
def settings(settings, engine_20):
    return settings.replace(**QUICK).replace(
        vllm_url=engine_20.url,
        gate_mode="fixed",
        max_inflight=OURS,
        worker_threads=OURS + 4,
        dispatch_prefetch=0,
        request_timeout_seconds=600.0,
        lease_seconds=30.0,
    )


def engine_reading(url: str) -> dict[str, float]:
    obs = parse_metrics(fetch(url + "/metrics", 5.0), time.time(), 5.0, 0)
    return {"waiting": obs.waiting, "running": obs.running}


def online_waiting(url: str, outstanding: int) -> float:
    """What the gate reads: the engine's /metrics with the node's O."""
    return parse_metrics(fetch(url + "/metrics", 5.0), time.time(), 5.0, outstanding).online_waiting


def test_one_online_request_queued_behind_20_running_batch_requests_reads_as_one(
    rt, make_batch, worker, celery_app, engine_20, settings
):
    batch = make_batch(OURS, model=PROFILE, max_tokens=LONG, extra_body={"ignore_eos": True})
    url = engine_20.url
    with worker():
        book = celery_app.tidal_context.leases
        wait_for(
            lambda: book.outstanding() == OURS and engine_reading(url) == {"waiting": 0, "running": OURS},
            timeout=300,
            what="all 20 of the node's batch requests running at the engine",
        )
        assert REGISTRY.get_sample_value("tidal_gate_engine_outstanding") == OURS
        assert online_waiting(url, book.outstanding()) == 0  # none queued reads as zero

        answered: list[int] = []
        online = threading.Thread(
            target=lambda: answered.append(
                requests.post(
                    url + "/v1/chat/completions",
                    json={"model": PROFILE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                    timeout=600,
                ).status_code
            ),
            daemon=True,
        )
        online.start()
        wait_for(
            lambda: engine_reading(url) == {"waiting": 1, "running": OURS},
            timeout=120,
            what="the online request queued behind the 20 running",
        )
        assert book.outstanding() == OURS  # all of ours are still at the engine, and all running
        assert online_waiting(url, book.outstanding()) >= 1  # the old estimate, waiting − O, read 0 here
        b, _out, err = settled(rt, batch, timeout=600)
        online.join(600)
    assert answered == [200] and (b.completed, err) == (OURS, [])
