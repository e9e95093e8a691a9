"""TidalScheduler's relative budget inside a real engine (issue 36, item 1): the timed twin, A6000 profile.

24 batch requests with 1,000-token prompts decode; 4 online requests arrive. While they run, each step may take
1.1 × T̂(its online work alone), priced on the twin's own profile (``start_twin`` names it to the plugin), so some
batch requests sit steps out; everything still completes. What the in-process tests
(tests/engine/test_tidal_scheduler.py) prove step by step, this shows wired through vLLM's engine-core process:
the settings arrive, the mode and the gauges are exported. No bound on the measured inflation: on two shared
cores the host's gaps between steps make it the machine's, not the plugin's (the frontier measures it).
"""

from __future__ import annotations

import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from config import load_settings
from tests.support.wait import wait_for
from tidal_engine.serve import free_port
from tidal_engine.serve import start_twin
from tidal_engine.step_time import decode_seconds
from tidal_engine.twin import load_profile
from tidal_workers.scrape import fetch
from tidal_workers.scrape import samples

pytestmark = pytest.mark.engine

PROFILE = "qwen2.5-7b@a6000"
ALPHA = 1.1
BATCH, BATCH_PROMPT, BATCH_TOKENS = 24, 1000, 160
ONLINE, ONLINE_TOKENS = 4, 120


@pytest.fixture(scope="module")
def relative_twin(tmp_path_factory):
    settings = load_settings().replace(sched_metrics_port=free_port(), sched_alpha_set=ALPHA)
    log_path = tmp_path_factory.mktemp("relative-twin") / "vllm.log"
    engine = start_twin(settings, PROFILE, log_path=log_path, tidal_scheduler=True, max_num_seqs=64, max_model_len=2048)
    yield types.SimpleNamespace(
        url=engine.url, plugin=f"http://127.0.0.1:{settings.sched_metrics_port}/metrics", log_path=log_path
    )
    engine.stop()


def read_plugin(url: str) -> dict[str, float]:
    """The plugin's page: each sample by name, the mode gauge by its mode (``mode=relative``)."""
    out: dict[str, float] = {}
    for sample in samples(fetch(url, 5.0)):
        key = f"mode={sample.labels['mode']}" if sample.name == "tidal_sched_mode" else sample.name
        out[key] = sample.value
    return out


def complete(url: str, prompt: str, max_tokens: int, priority: int) -> int:
    body = {"model": PROFILE, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "priority": priority}
    response = requests.post(url + "/v1/completions", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["completion_tokens"])


@pytest.mark.timeout(900)
def test_online_steps_keep_to_alpha_times_their_online_work_alone(relative_twin):
    engine = relative_twin
    seen: list[dict[str, float]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(read_plugin(engine.plugin))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(BATCH + ONLINE) as pool:
            batch = [  # one byte a token: 1,000-token prompts, each its own (no prefix shared)
                pool.submit(complete, engine.url, chr(65 + i) * BATCH_PROMPT, BATCH_TOKENS, 2) for i in range(BATCH)
            ]
            wait_for(lambda: seen and seen[-1].get("tidal_sched_working_set", 0) >= BATCH // 2, 300, "batch decoding")
            online = [pool.submit(complete, engine.url, chr(97 + i) * 64, ONLINE_TOKENS, 0) for i in range(ONLINE)]
            assert [f.result() for f in online] == [ONLINE_TOKENS] * ONLINE
            during = list(seen)
            assert [f.result() for f in batch] == [BATCH_TOKENS] * BATCH
    finally:
        stop.set()
        watcher.join(10)

    relative = [m for m in during if m.get("mode=relative") == 1.0]
    assert during[-1]["tidal_sched_alpha_set"] == ALPHA
    assert relative, "no scrape saw a budgeted step"
    reference = relative[-1]["tidal_sched_reference_step_seconds"]
    alone = decode_seconds(load_profile(PROFILE), ONLINE, 64 + ONLINE_TOKENS // 2)
    assert 0.8 * alone <= reference <= 3 * alone, (reference, alone)  # online decodes, some with their prompts
    assert during[-1]["tidal_sched_inflation"] > 0  # measured and exported
    assert min(m["tidal_sched_working_set"] for m in relative) < BATCH  # some batch requests sat steps out
