"""A-P on the real engine (issue 21): KV frozen by one engine process is thawed by the next, bit-identically.

The dense model behind TidalFreezeConnector (tidal_engine.freeze: vLLM's example connector, narrowed to requests
tagged with a batch, one folder per batch, never a chunked prompt). Single requests to an idle engine, because
vLLM's output is not batch-invariant. A thaw shows as ``cached_tokens``: a fresh engine's prefix cache is empty,
so tokens it did not compute came from the folder. A prompt whose frozen KV is lost (its batch's folder deleted)
or was never frozen (longer than τ) is recomputed, never an error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from config import load_settings
from tidal_engine.freeze import TAG
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import freeze_connector_args
from tidal_engine.serve import start_engine
from tidal_engine.tiny import build_tiny
from tidal_workers.bench.kv_probe import ask
from tidal_workers.bench.kv_probe import prompt

pytestmark = pytest.mark.engine

BLOCK = 128  # the CPU backend's KV block: a thaw loads the prompt's whole blocks but its last token's
TAU = 2048


def _options(storage: Path) -> EngineOptions:
    return EngineOptions(
        model=str(build_tiny(load_settings().home, "dense")),
        served_model_name="dense",
        max_num_batched_tokens=TAU,
        max_model_len=4096,
        extra_args=(*freeze_connector_args(storage), "--enable-prompt-tokens-details"),
    )


def test_frozen_kv_thaws_bit_identically_after_an_engine_restart(tmp_path):
    storage = tmp_path / "kv"
    options = _options(storage)
    texts = {
        "kept": (prompt("freeze-kept", 1500), "batch_a"),
        "lost": (prompt("freeze-lost", 1200), "batch_b"),
        "chunked": (prompt("freeze-long", 2900), "batch_a"),  # over τ: a chunked prefill, never frozen
        "online": (prompt("freeze-online", 1000), None),  # untagged: passes through
    }

    def run(engine_url: str, name: str):
        text, batch = texts[name]
        return ask(engine_url, "dense", text, 16, kv_transfer_params={TAG: batch} if batch else None)

    engine = start_engine(options, log_path=tmp_path / "freeze.log")
    try:
        first = {name: run(engine.url, name) for name in texts}
    finally:
        engine.stop()
    assert {name: a.prompt_tokens for name, a in first.items()} == {
        "kept": 1500,
        "lost": 1200,
        "chunked": 2900,
        "online": 1000,
    }
    assert sorted(p.name for p in storage.iterdir()) == ["batch_a", "batch_b"]  # nothing of the online request
    (kept_folder,) = (storage / "batch_a").iterdir()  # the chunked prompt was not frozen
    assert sorted(f.name for f in kept_folder.iterdir()) == [
        "model.layers.0.self_attn.attn.safetensors",
        "model.layers.1.self_attn.attn.safetensors",
    ]
    shutil.rmtree(storage / "batch_b")  # batch_b ended between the phases: its frozen KV is gone

    engine = start_engine(options, log_path=tmp_path / "thaw.log")
    try:
        second = {name: run(engine.url, name) for name in texts}
        assert engine.process.poll() is None
    finally:
        engine.stop()
    assert second["kept"].cached_tokens == (1500 - 2) // BLOCK * BLOCK  # every whole block but the last token's
    assert second["lost"].cached_tokens == second["chunked"].cached_tokens == second["online"].cached_tokens == 0
    for name in texts:  # thawed or recomputed, greedy output is the same as the first process's
        assert second[name].token_ids == first[name].token_ids and len(first[name].token_ids) == 16, name
