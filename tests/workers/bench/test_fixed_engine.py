"""The dispatch benchmark's fixed-time engine speaks enough of vLLM's protocol for a real worker to claim for it."""

from __future__ import annotations

import requests

from tidal_workers.bench.fixed_engine import MODEL
from tidal_workers.bench.fixed_engine import FixedEngine
from tidal_workers.served import engine_models


def test_it_lists_its_model_where_a_node_reads_it_and_answers_for_it():
    """A node claims only the models its engine lists on /v1/models; without the list the benchmark's worker
    claimed nothing and the run timed out (1 December)."""
    engine = FixedEngine(delay=0.01)
    try:
        assert engine_models(engine.url) == (MODEL,)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8}
        answer = requests.post(engine.url + "/v1/chat/completions", json=body, timeout=10).json()
        assert answer["model"] == MODEL and answer["usage"]["completion_tokens"] == 8
    finally:
        engine.close()
