"""TidalScheduler on a real vLLM-CPU server beside a batch backlog: what it decides, step by step (issue 14).

The plugin's per-step accounting, exported from the engine-core process (docs/engine.md, "Metrics"), is
asserted while online requests run beside batch requests whose prefills are larger than the cap:

- batch work was held to the cap: steps with online traffic in which batch reached X, and no token past it
  (the session's plugin engine pins X to the static share of τ, 512 tokens, below each batch prompt's ~1,010;
  tests/conftest.py says why)
  (``tidal_sched_batch_over_cap_tokens``: online prompts here never share a first block, so their reserved
  demand is exact and there is no unused reservation to take);
- online tokens were never deferred (every online request got all it asked for in every step) nor preempted;
- the online tokens the plugin counted are exactly those the requests needed: prompt + completion − 1 each.

This replaces a TBT comparison between a stock and a plugin engine (tests/e2e/test_plugin_tbt.py), which
measured latency between two processes on shared cores and failed on a clean machine. That comparison is a
benchmark: `tidal bench harvest` (docs/benchmarks.md). The step invariants are also checked in-process on
vLLM's real scheduler class (tests/engine/test_tidal_scheduler.py).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from config import load_settings
from tests.support.engine_readings import reading_when
from tidal_engine.serve import EngineOptions
from tidal_workers.bench import engine_stats

pytestmark = pytest.mark.engine

LANES = 2  # batch requests in flight: 2 x ~1,010 tokens fill two thirds of the 3,072-token KV pool
BATCH_MAX_TOKENS = 8  # short outputs: a fresh prefill, larger than the static cap (512), every few steps
ONLINE_CLIENTS, ONLINE_REQUESTS, ONLINE_MAX_TOKENS = 2, 6, 24
STATIC_CAP = int(load_settings().sched_static_cap_frac * EngineOptions.max_num_batched_tokens)  # the engine's X


def complete(http: requests.Session, url: str, model: str, prompt: str, priority: int, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "priority": priority}
    response = http.post(url + "/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_plugin_holds_batch_to_the_cap_and_online_gets_its_whole_demand(tiny_plugin_engine):
    engine = tiny_plugin_engine
    before = engine_stats.read_plugin(engine.plugin_metrics_url)
    stop = threading.Event()
    batch_done: list[dict] = []

    def backlog(lane: int) -> None:
        with requests.Session() as http:
            n = 0
            while not stop.is_set():
                # A unique head: no two prompts share a prefix-cache block, so every admission is a real prefill.
                prompt = f"{n:06d} lane {lane}: " + "tide data " * 99
                batch_done.append(complete(http, engine.url, engine.model, prompt, 5, BATCH_MAX_TOKENS))
                n += 1

    def online(client: int) -> list[dict]:
        with requests.Session() as http:
            return [
                complete(
                    http,
                    engine.url,
                    engine.model,
                    f"online {client}-{i:06d}: what is the tide doing? ",
                    0,
                    ONLINE_MAX_TOKENS,
                )
                for i in range(ONLINE_REQUESTS)
            ]

    with ThreadPoolExecutor(LANES + ONLINE_CLIENTS) as pool:
        lanes = [pool.submit(backlog, lane) for lane in range(LANES)]
        # The online requests start once the backlog is running in the engine (an event, with a deadline).
        reading_when(engine.url, lambda r: r.running >= LANES, timeout=120, what="the batch backlog")
        online_usage = [u for usages in pool.map(online, range(ONLINE_CLIENTS)) for u in usages]
        stop.set()
        for lane in lanes:
            lane.result()
    after = engine_stats.read_plugin(engine.plugin_metrics_url)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    print(f"plugin accounting over the run: {delta}; batch requests {len(batch_done)}")

    assert batch_done and all(u["completion_tokens"] == BATCH_MAX_TOKENS for u in batch_done)
    assert min(u["prompt_tokens"] for u in batch_done) > STATIC_CAP  # every fresh batch prefill can reach X
    assert all(u["completion_tokens"] == ONLINE_MAX_TOKENS for u in online_usage)
    # The backlog pressed on the cap while online traffic set the budget, and batch work was done beside it.
    assert delta["tidal_sched_capped_steps_total"] > 0 and delta["tidal_sched_batch_tokens_total"] > 0
    assert delta["tidal_sched_batch_over_cap_tokens_total"] == 0
    assert delta["tidal_sched_online_deferred_tokens_total"] == 0
    assert delta["tidal_sched_online_preempted_total"] == 0
    needed = sum(u["prompt_tokens"] + u["completion_tokens"] - 1 for u in online_usage)
    assert delta["tidal_sched_online_tokens_total"] == needed
    # A labelled series is read per label value: the host's fit per part, not the sum of its two parts.
    assert {"tidal_sched_host_seconds:step", "tidal_sched_host_seconds:request"} <= after.keys()
    assert "tidal_sched_host_seconds" not in after
