"""Online requests beside a batch backlog that a gate keeps below the engine's slots (issue 5, item 2).

vLLM's priority orders only its waiting queue: a priority-0 request waits for a free slot like any other
(vLLM issue #40004). So the backlog is what a gate allows, ``max_num_seqs - HEADROOM`` batch requests at
priority 100, and each online request must find a free slot in the step after it arrives and get its whole
demand scheduled in every step until it finishes.

What is asserted is what the engine decided, read from TidalScheduler's per-step accounting on the plugin
engine (the plugin keeps slots exactly as the stock scheduler does; docs/engine.md): no online token was ever
deferred (``tidal_sched_online_deferred_tokens``: waiting for a slot or KV, or chunked), and the online tokens
scheduled are exactly what the requests needed. In-process, tests/engine/test_tidal_scheduler.py shows the same
counter counting an online request that finds every slot taken.

This replaces a comparison of median TTFT with and without the backlog (loaded <= 2 x unloaded + 0.2 s), a
wall-clock latency comparison on shared cores; TTFT inflation is measured by `tidal bench harvest`.
"""

from __future__ import annotations

import pytest
import requests

from tests.support.engine_readings import reading_when
from tidal_workers.bench import engine_stats
from tidal_workers.bench import gate_trace
from tidal_workers.gate import FixedGate

pytestmark = pytest.mark.engine

HEADROOM = 2  # slots the gate leaves free for online requests
ROUNDS = 7
ONLINE_MAX_TOKENS = 16


def test_online_requests_beside_a_gated_backlog_never_wait(tiny_plugin_engine):
    engine = tiny_plugin_engine
    inflight = engine.max_num_seqs - HEADROOM
    before = engine_stats.read_plugin(engine.plugin_metrics_url)
    usages = []
    trickle = gate_trace.Trickle(engine.url, engine.model, FixedGate(inflight), max_tokens=128)
    with trickle as backlog, requests.Session() as http:
        for i in range(ROUNDS):
            # The backlog holds its slots (waves of batch requests end together: one may be in between).
            reading_when(engine.url, lambda r: r.running >= inflight - 1, 120, "the batch backlog")
            body = {
                "model": engine.model,
                "prompt": f"online {i:06d}: what is the tide doing today?",
                "max_tokens": ONLINE_MAX_TOKENS,
                "ignore_eos": True,
                "priority": 0,
            }
            response = http.post(engine.url + "/v1/completions", json=body, timeout=300)
            assert response.status_code == 200, response.text
            usages.append(response.json()["usage"])
    after = engine_stats.read_plugin(engine.plugin_metrics_url)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    print(f"plugin accounting beside the gated backlog: {delta}; batch requests resent: {backlog.resent}")

    assert not backlog.errors, backlog.errors[:3]
    assert backlog.completed >= inflight
    assert all(u["completion_tokens"] == ONLINE_MAX_TOKENS for u in usages)
    assert delta["tidal_sched_online_deferred_tokens_total"] == 0
    assert delta["tidal_sched_online_preempted_total"] == 0
    assert delta["tidal_sched_online_tokens_total"] == sum(
        u["prompt_tokens"] + u["completion_tokens"] - 1 for u in usages
    )
