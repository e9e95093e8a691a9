"""The end-to-end tests' timed twin: steps take the GPU's time whatever this machine's load."""

from __future__ import annotations

import types

import pytest

from config import load_settings

TWIN_PROFILE = "qwen2.5-7b@a6000"


@pytest.fixture(scope="session")
def twin(tmp_path_factory):
    """The twin with the end-to-end tests' 8 slots: a decode step takes ~25 ms, a 384-token answer ~10 s.

    A load the tests send stays in the engine for seconds on an idle machine too, where the tiny CPU engine
    served it faster than /metrics could show it (two clean-clone runs, 1 December).
    """
    from tidal_engine.serve import start_twin

    log_path = tmp_path_factory.mktemp("gate-twin") / "vllm.log"
    engine = start_twin(load_settings(), TWIN_PROFILE, log_path=log_path, max_num_seqs=8, max_model_len=2048)
    yield types.SimpleNamespace(url=engine.url, model=TWIN_PROFILE)
    engine.stop()
