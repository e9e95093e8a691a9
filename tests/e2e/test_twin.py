"""The timed twin on the real engine: vLLM serves the twin model paced by its profile, with TidalScheduler loaded.

Asserts what the twin and the scheduler decide (each step's P, C and target, the steps TidalScheduler
builds while online traffic is present), never how long anything took.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from config import load_settings
from tests.support.wait import wait_for
from tidal_engine.serve import free_port
from tidal_engine.serve import start_twin
from tidal_engine.step_time import decode_seconds
from tidal_engine.step_time import prefill_seconds
from tidal_engine.twin import load_profile
from tidal_workers.bench.twin import read_trace

PROFILE = "qwen2.5-7b@a6000"
TAU = 2048


@pytest.fixture(scope="module")
def traced_twin(tmp_path_factory):
    """The twin with TidalScheduler, writing each step to its trace: (engine, trace path)."""
    work = tmp_path_factory.mktemp("twin")
    trace = work / "trace.csv"
    settings = load_settings().replace(sched_metrics_port=free_port())
    engine = start_twin(settings, PROFILE, log_path=work / "vllm.log", tidal_scheduler=True, trace_path=trace)
    yield engine, trace
    engine.stop()


def complete(url: str, prompt: list[int], max_tokens: int, priority: int = 0, stream: bool = False):
    body = {"model": PROFILE, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "priority": priority}
    if stream:
        # Random weights often sample bytes that decode to no text: count tokens from the usage stats.
        body |= {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    return requests.post(f"{url}/v1/completions", json=body, stream=stream, timeout=300)


def test_the_twin_serves_and_paces_each_step_by_its_profile(traced_twin):
    engine, trace = traced_twin
    profile = load_profile(PROFILE)
    prompt = [int(x) for x in np.random.default_rng(1).integers(0, 256, 300)]
    started = time.monotonic()
    response = complete(engine.url, prompt, 8)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (300, 8)
    # One prefill step, then seven decode steps (the prefill samples the first token). A step's line is
    # written before its forward returns, so before the response.
    rows = [r for r in read_trace(trace) if r["started_s"] >= started]
    assert len(rows) == 8
    assert (rows[0]["num_tokens"], rows[0]["context"], rows[0]["num_reqs"]) == (300, 0, 1)
    assert rows[0]["target_s"] == pytest.approx(prefill_seconds(profile, 300, 0), rel=1e-9)
    for k, row in enumerate(rows[1:]):
        assert (row["num_tokens"], row["context"]) == (1, 300 + k)
        assert row["target_s"] == pytest.approx(decode_seconds(profile, 1, 300 + k), rel=1e-9)
    log = Path(engine.log_path).read_text()
    assert f"timed twin: profile {PROFILE}" in log
    # The KV pool holds the GPU's tokens (vLLM rounds it to whole pages).
    pool = int(log.split("KV cache size: ")[1].split(" tokens")[0].replace(",", ""))
    assert abs(pool - profile.kv_pool_tokens) <= 64
    served = requests.get(f"{engine.url}/v1/models", timeout=10).json()["data"][0]
    assert served["id"] == PROFILE and served["max_model_len"] == 8192


def test_tidal_scheduler_on_the_twin_shrinks_steps_while_online_traffic_runs(traced_twin):
    """Batch alone fills τ; while an online request decodes, every step fits the TBT SLO and batch still moves."""
    engine, trace = traced_twin
    profile = load_profile(PROFILE)
    slo_s = load_settings().sched_tbt_slo_ms / 1000
    assert prefill_seconds(profile, TAU) > slo_s  # a full-τ step would break the SLO on this GPU
    rng = np.random.default_rng(2)
    started = time.monotonic()
    batch = [
        threading.Thread(target=complete, args=(engine.url, [int(x) for x in rng.integers(0, 256, 4000)], 4, 5))
        for _ in range(8)
    ]
    for thread in batch:
        thread.start()
    wait_for(
        lambda: any(r["num_tokens"] == TAU for r in read_trace(trace) if r["started_s"] >= started),
        120,
        f"a step of {TAU} tokens in the trace",
    )

    online = complete(engine.url, [int(x) for x in rng.integers(0, 256, 100)], 30, priority=0, stream=True)
    received = [  # (client time, tokens so far)
        (time.monotonic(), usage["completion_tokens"])
        for line in online.iter_lines()
        if line.startswith(b"data: {") and (usage := json.loads(line[6:]).get("usage"))
    ]
    assert received[-1][1] == 30
    # The engine schedules its next step before the client reads a token, so the step after the online
    # request's last one (batch alone again) may start before the last token arrives: end the window at
    # the arrival of a token at least two before the last.
    first_token = received[0][0]
    online_done = max(t for t, tokens in received if tokens <= 28)
    for thread in batch:
        thread.join(timeout=300)

    rows = [r for r in read_trace(trace) if first_token <= r["started_s"] <= online_done]
    assert rows, "no step ran while the online request decoded"
    assert max(r["target_s"] for r in rows) <= slo_s, json.dumps(rows)
    assert any(r["num_tokens"] > r["num_reqs"] for r in rows)  # batch prefill chunks rode along
