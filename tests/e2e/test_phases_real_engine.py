"""A-P, claiming by phase, on the real vLLM-CPU engine with TidalFreezeConnector (issue 21).

A batch ingested with ``phase_split=always`` runs through a real worker: each item's prefill (max_tokens 1,
tagged with the batch) freezes its prompt's KV into the connector's folder, its decode thaws it. The engine's
prefix cache is off, so a decode's ``cached_tokens`` can only have come through the connector: the tokens it did
not compute were read back from what its prefill froze. The worker holds one request at the engine at a time (a
fixed gate of 1, no prefetch), so every request runs alone and a decode's greedy text can be compared with the
same request sent whole (vLLM's output is not batch-invariant).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests
from sqlalchemy import select

from config import load_settings
from tests.support.wait import wait_for
from tests.support.worker_helpers import QUICK
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import file_lines
from tests.support.worker_helpers import validating_batch
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import freeze_connector_args
from tidal_engine.serve import start_engine
from tidal_engine.tiny import build_tiny
from tidal_workers.bench.kv_probe import prompt
from tidal_workers.ingest import ingest_batch
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "dense"  # the freeze / thaw test's model (tests/e2e/test_freeze_thaw.py)
BLOCK = 128  # the CPU backend's KV block: a thaw loads the prompt's whole blocks but its last token's
TAU = 2048  # a prompt is frozen only when its whole prefill fits one step
PROMPT_CHARS = (900, 1000, 1100)  # one token a character: under τ, so each is frozen whole
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def freezing_engine(tmp_path_factory):
    """The dense model behind TidalFreezeConnector over a temp folder, prefix cache off: (engine, folder)."""
    storage = tmp_path_factory.mktemp("frozen")
    options = EngineOptions(
        model=str(build_tiny(load_settings().home, MODEL)),
        served_model_name=MODEL,
        max_num_batched_tokens=TAU,
        max_model_len=4096,
        extra_args=(
            *freeze_connector_args(storage),
            "--enable-prompt-tokens-details",
            "--no-enable-prefix-caching",
        ),
    )
    engine = start_engine(options, log_path=tmp_path_factory.mktemp("engine") / "vllm.log", timeout_s=600)
    try:
        yield engine, storage
    finally:
        engine.stop()


@pytest.fixture
def settings(settings, freezing_engine):
    engine, storage = freezing_engine
    return settings.replace(**QUICK).replace(
        vllm_url=engine.url,
        kv_freeze_dir=str(storage),
        gate_mode="fixed",
        max_inflight=1,  # one request at the engine at a time: each runs alone
        dispatch_prefetch=0,
        lease_seconds=30.0,
        request_timeout_seconds=120.0,
    )


def _body(text: str) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,  # exactly MAX_TOKENS: the decode's count is known
    }


def _counters(url: str) -> dict[str, float]:
    """vLLM's /metrics counters this test reads, each summed over its label sets."""
    page = requests.get(url + "/metrics", timeout=30).text
    names = (
        "vllm:request_success_total",
        "vllm:generation_tokens_total",
        "vllm:external_prefix_cache_hits_total",
        "vllm:prefix_cache_hits_total",
    )
    found = dict.fromkeys(names, 0.0)
    for line in page.splitlines():
        m = re.match(r"^([a-z_:]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m and m.group(1) in found:
            found[m.group(1)] += float(m.group(2))
    return found


def _frozen(storage: Path, batch_id: str) -> dict[str, list[str]]:
    folder = storage / batch_id
    if not folder.is_dir():
        return {}
    return {p.name: sorted(f.name for f in p.iterdir()) for p in folder.iterdir()}


def _phases(rt, batch_id: str) -> list[str]:
    with rt.store.read() as s:
        return list(s.scalars(select(Item.phase).where(Item.batch_id == batch_id).order_by(Item.line)))


@pytest.mark.timeout(1200)
def test_a_split_batch_freezes_each_prompt_and_thaws_it_for_its_decode(rt, worker, freezing_engine):
    engine, storage = freezing_engine
    bodies = {f"item-{i}": _body(prompt(f"ap-real-{i}", n)) for i, n in enumerate(PROMPT_CHARS)}
    data = b"".join(
        json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b}).encode() + b"\n"
        for c, b in bodies.items()
    )
    batch = validating_batch(rt, data)
    with rt.store.transaction() as s:
        s.get(Batch, batch).phase_split = "always"
    ingest_batch(rt, batch)
    assert _phases(rt, batch) == ["prefill"] * 3, "ingest did not split every item"
    before = _counters(engine.url)

    def state() -> str:
        b = batch_row(rt, batch)
        return (
            f"batch {batch} to complete: still {b.status}, phases {_phases(rt, batch)}, completed {b.completed}, "
            f"failed {b.failed}, frozen {_frozen(storage, batch)}; log {engine.log_path}"
        )

    with worker():
        wait_for(lambda: batch_row(rt, batch).status == "completed", 600, state, every=0.2)
    b = batch_row(rt, batch)
    after = _counters(engine.url)
    out, err = file_lines(rt, b.output_file_id), file_lines(rt, b.error_file_id)
    assert (b.completed, b.failed, err) == (3, 0, []), f"error lines: {err}"
    assert_exactly_once(rt, batch, out, err)
    assert sorted(line["custom_id"] for line in out) == sorted(bodies)
    assert _phases(rt, batch) == ["decode"] * 3  # every prefill answered and moved its item on

    # The prefills froze one folder per prompt under the batch's own folder, every layer's KV in it.
    frozen = _frozen(storage, batch)
    assert len(frozen) == 3, f"frozen prompts under {storage / batch}: {frozen}"
    layers = ["model.layers.0.self_attn.attn.safetensors", "model.layers.1.self_attn.attn.safetensors"]
    assert all(files == layers for files in frozen.values()), frozen
    assert [p.name for p in storage.iterdir()] == [batch]

    # The engine saw seven requests: the worker's preflight probe (one token, at its start), three prefills of one
    # token and three decodes of MAX_TOKENS, no retry.
    seen = {k: after[k] - before[k] for k in after}
    assert seen["vllm:request_success_total"] == 1 + 6, seen
    assert seen["vllm:generation_tokens_total"] == 1 + 3 * (1 + MAX_TOKENS), seen
    assert seen["vllm:prefix_cache_hits_total"] == 0, seen  # prefix cache off: a hit is the connector's

    usages = {line["custom_id"]: line["response"]["body"]["usage"] for line in out}
    for cid, usage in usages.items():
        thawed = usage["prompt_tokens_details"]["cached_tokens"]
        assert usage["completion_tokens"] == MAX_TOKENS, (cid, usage)  # the decode's answer, not the prefill's 1
        # Every whole block but the last token's came from the folder (the freeze test's figure).
        assert thawed > 0 and thawed == (usage["prompt_tokens"] - 2) // BLOCK * BLOCK, (cid, usage)
        assert usage["prompt_tokens"] < TAU, (cid, usage)
    assert seen["vllm:external_prefix_cache_hits_total"] == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in usages.values()
    ), (seen, usages)
    # Billed once: the batch's usage is its decodes', the thawed tokens counted as cached.
    assert (b.input_tokens, b.cached_tokens, b.output_tokens) == (
        sum(u["prompt_tokens"] for u in usages.values()),
        sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages.values()),
        3 * MAX_TOKENS,
    )

    # Thawed, then decoded: the same greedy text as the whole request recomputed alone on the idle engine.
    for line in out:
        cid = line["custom_id"]
        r = requests.post(engine.url + "/v1/chat/completions", json=bodies[cid], timeout=300)
        assert r.status_code == 200, r.text
        whole = r.json()
        assert whole["usage"]["prompt_tokens"] == usages[cid]["prompt_tokens"]
        assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # untagged: recomputed
        split_text, whole_text = (
            line["response"]["body"]["choices"][0]["message"]["content"],
            whole["choices"][0]["message"]["content"],
        )
        assert split_text == whole_text, (cid, split_text, whole_text)
    assert engine.process.poll() is None
