"""The benchmarks' twin is the twin every other launcher starts: its model in the engine core, no worker spinning."""

from __future__ import annotations

import psutil
import requests

from config import load_settings
from tidal_workers.bench.engines import EngineRequest
from tidal_workers.bench.engines import started

PROFILE = "qwen2.5-7b@a6000"


def test_the_benchmarks_twin_runs_its_model_in_the_engine_core_with_no_worker_process(tmp_path):
    """A separate model worker would have the engine core busy-poll vLLM's shared-memory queue while the twin
    sleeps out each step, as the harvest, dispatch and fleet benchmarks' twin did until 2 December."""
    request = EngineRequest("twin", PROFILE, max_num_seqs=4)
    with started(request, load_settings(), plugin=False, log_path=tmp_path / "twin.log") as twin:
        body = {"model": twin.model, "prompt": "x", "max_tokens": 2, "ignore_eos": True}
        assert requests.post(f"{twin.url}/v1/completions", json=body, timeout=120).status_code == 200
        server = _listening_on(int(twin.url.rsplit(":", 1)[1]))
        children = [" ".join(p.cmdline()) for p in server.children(recursive=True)]
        assert any("VLLM::EngineCore" in c for c in children), children
        assert not any("VLLM::Worker" in c for c in children), children
        assert server.environ()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def _listening_on(port: int) -> psutil.Process:
    """The process serving ``port``: `vllm serve`'s API server."""
    pids = {c.pid for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == psutil.CONN_LISTEN}
    assert len(pids) == 1, pids
    return psutil.Process(pids.pop())
