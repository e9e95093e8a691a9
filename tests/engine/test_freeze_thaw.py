"""A-P on the real engine (issue 21): KV frozen by one engine process is thawed by the next, bit-identically.

The dense model behind vLLM's ExampleConnector (a shared folder, one safetensors file per layer and prompt),
with τ raised over the prompts: that connector stores one prefill chunk only, and thawing a chunked prompt
kills the engine core (docs/engine.md, KV connectors). Single requests to an idle engine, because vLLM's output
is not batch-invariant. A thaw shows as ``cached_tokens``: a fresh engine's prefix cache is empty, so tokens
it did not compute came from the folder. A prompt whose frozen KV is lost is recomputed, never an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config import load_settings
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import start_engine
from tidal_engine.tiny import build_tiny
from tidal_workers.bench.kv_probe import ask
from tidal_workers.bench.kv_probe import prompt

pytestmark = pytest.mark.engine

BLOCK = 16  # vLLM's block size on this build: the connector thaws whole blocks of the prompt but its last token
TAU = 4096


def _options(storage: Path) -> EngineOptions:
    config = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    return EngineOptions(
        model=str(build_tiny(load_settings().home, "dense")),
        served_model_name="dense",
        max_num_batched_tokens=TAU,
        max_model_len=TAU,
        extra_args=("--kv-transfer-config", json.dumps(config), "--enable-prompt-tokens-details"),
    )


def test_frozen_kv_thaws_bit_identically_after_an_engine_restart(tmp_path):
    storage = tmp_path / "kv"
    options = _options(storage)
    kept, lost = prompt("freeze-kept", 1500), prompt("freeze-lost", 1200)

    engine = start_engine(options, log_path=tmp_path / "freeze.log")
    try:
        frozen_kept = ask(engine.url, "dense", kept, 16)
        folders_before = set(storage.iterdir())
        frozen_lost = ask(engine.url, "dense", lost, 16)
        (lost_folder,) = set(storage.iterdir()) - folders_before
    finally:
        engine.stop()
    assert frozen_kept.cached_tokens == 0 and frozen_kept.prompt_tokens == 1500
    assert sorted(f.name for f in lost_folder.iterdir()) == [
        "model.layers.0.self_attn.attn.safetensors",
        "model.layers.1.self_attn.attn.safetensors",
    ]
    for f in lost_folder.iterdir():  # storage lost between the phases
        f.unlink()
    lost_folder.rmdir()

    engine = start_engine(options, log_path=tmp_path / "thaw.log")
    try:
        thawed = ask(engine.url, "dense", kept, 16)
        recomputed = ask(engine.url, "dense", lost, 16)
    finally:
        engine.stop()
    assert thawed.cached_tokens == (1500 - 2) // BLOCK * BLOCK  # every whole block but the last token's
    assert thawed.token_ids == frozen_kept.token_ids and len(thawed.token_ids) == 16
    assert recomputed.cached_tokens == 0  # nothing to thaw: computed again
    assert recomputed.token_ids == frozen_lost.token_ids
    assert "External Cache Hit!" in (tmp_path / "thaw.log").read_text()
