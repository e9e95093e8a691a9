"""The gate's signal maps on a real engine's /metrics (issue 21, A-D): the disaggregated map reads the pools.

One real vLLM stands in for both pools (two engines do not fit beside the rest of the suite on 2 cores): the
``disagg`` map must read the same series from each page and combine them as documented (KV the fuller pool's,
counts summed), so its Observation is the single-engine one with every count doubled.

The engine is the timed twin: its 12 requests of 384 tokens on 8 slots stay in it for ~20 s whatever the machine's
load, so the page the test reads shows them. On the tiny CPU engine an idle machine served the load before /metrics
showed it (a CI run, 1 December).
"""

from __future__ import annotations

import concurrent.futures
import os
import time

import pytest
import requests

from config import load_settings
from tests.support.wait import wait_for
from tidal_workers.gate import AimdGate
from tidal_workers.gate import parse_metrics
from tidal_workers.gate import parse_pages
from tidal_workers.policy.aimd import FAILSAFE
from tidal_workers.scrape import fetch
from tidal_workers.signals import DECODE
from tidal_workers.signals import DISAGG
from tidal_workers.signals import PREFILL

pytestmark = pytest.mark.engine


def _load(url: str, model: str, n: int) -> list[int]:
    body = {"model": model, "prompt": "x" * 300, "max_tokens": 384, "temperature": 0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(requests.post, url + "/v1/completions", json=body, timeout=300) for _ in range(n)]
        return [f.result().status_code for f in futures]


def test_disaggregated_map_reads_real_pool_pages(twin):
    metrics_url = twin.url + "/metrics"
    with concurrent.futures.ThreadPoolExecutor(1) as runner:
        load = runner.submit(_load, twin.url, twin.model, 12)  # 12 requests on 8 slots

        def running_page():
            """The engine's page and its reading, once it shows a request running."""
            page = fetch(metrics_url, 5.0)
            single = parse_metrics(page, time.time(), 5.0, 0)
            return (page, single) if single.running > 0 else None

        page, single = wait_for(
            running_page, 240, lambda: f"the load to show up in /metrics (load average {os.getloadavg()})"
        )
        pooled = parse_pages({PREFILL: page, DECODE: page}, time.time(), 5.0, 0, DISAGG)
        assert load.result() == [200] * 12
    assert pooled.kv_usage == single.kv_usage and 0 < pooled.kv_usage <= 1
    assert (pooled.running, pooled.waiting, pooled.preemptions_total) == (
        2 * single.running,
        2 * single.waiting,
        2 * single.preemptions_total,
    )

    settings = load_settings().replace(
        gate_mode="aimd",
        gate_signals="disagg",
        gate_metrics_urls=f"prefill={metrics_url},decode={metrics_url}",
        # a scrape may wait half a period: the 0.5 s of the default 1-s period is too short for a page on a 2-core
        # CI host with the soaks beside it (a CI run, 7 December); what this test reads is the map, not the timing
        scrape_seconds=10.0,
    )
    gate = AimdGate(settings)
    gate.poll(time.time(), 0)
    assert gate.state.decision != FAILSAFE, "the gate could not read the pools' real pages"
