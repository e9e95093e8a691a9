"""Staged prefill on the real vLLM-CPU engine (stock scheduler, prefix cache on, as vLLM ships it): a batch's
prompts reach the engine a chunk per step, and each item's own request finds all but its last chunk cached.

One request at the engine at a time (a fixed gate of 1, no prefetch), so each of vLLM's per-step token counts
(``vllm:iteration_tokens_total``, computed prompt tokens plus sampled ones) is one request's step: a staged
prompt's steps stay within a chunk and its one sampled token, where the same prompt sent whole is one step of
all its tokens.
"""

from __future__ import annotations

import json
import re

import pytest
import requests

from tests.support.wait import wait_for
from tests.support.worker_helpers import QUICK
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import file_lines
from tests.support.worker_helpers import validating_batch
from tidal_workers.bench.kv_probe import prompt
from tidal_workers.ingest import ingest_batch

pytestmark = pytest.mark.engine

CHUNK = 128  # the CPU backend's KV block (vLLM's CPU platform default): the prefix cache keeps whole blocks
PROMPT_CHARS = (700, 900, 1100)  # one token a character, plus the chat template's few
MAX_TOKENS = 4


@pytest.fixture
def settings(settings, detailed_engine):
    return settings.replace(**QUICK).replace(
        vllm_url=detailed_engine.url,
        gate_mode="fixed",
        max_inflight=1,  # one request at the engine at a time: each step is one request's
        dispatch_prefetch=0,
        request_timeout_seconds=120.0,
        prefill_stage_tokens=CHUNK,
    )


def _step_tokens(url: str) -> dict[str, float]:
    """``vllm:iteration_tokens_total``'s cumulative buckets (``le`` -> steps), summed over label sets."""
    buckets: dict[str, float] = {}
    for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
        m = re.match(r'^vllm:iteration_tokens_total_bucket\{.*le="([^"]+)".*\} ([0-9.eE+-]+)$', line)
        if m:
            buckets[m.group(1)] = buckets.get(m.group(1), 0.0) + float(m.group(2))
    return buckets


def _steps_over(before: dict[str, float], after: dict[str, float], tokens: int) -> float:
    """Steps between two readings that counted more than ``tokens`` (a bucket bound)."""
    le = f"{float(tokens)}"
    return (after["+Inf"] - before["+Inf"]) - (after[le] - before[le])


@pytest.mark.timeout(900)
def test_a_staged_batch_reaches_the_engine_a_chunk_a_step_and_hits_its_warmed_prefix(rt, worker, detailed_engine):
    model = detailed_engine.model
    bodies = {
        f"item-{i}": {
            "model": model,
            "messages": [{"role": "user", "content": prompt(f"staged-{i}", n)}],
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
        }
        for i, n in enumerate(PROMPT_CHARS)
    }
    data = b"".join(
        json.dumps({"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b}).encode() + b"\n"
        for c, b in bodies.items()
    )
    batch = validating_batch(rt, data)
    ingest_batch(rt, batch)
    before = _step_tokens(detailed_engine.url)
    with worker():
        wait_for(lambda: batch_row(rt, batch).status == "completed", 600, f"batch {batch} to complete", every=0.2)
    after = _step_tokens(detailed_engine.url)
    b = batch_row(rt, batch)
    out, err = file_lines(rt, b.output_file_id), file_lines(rt, b.error_file_id)
    assert (b.completed, b.failed, err) == (3, 0, []), f"error lines: {err}"
    assert_exactly_once(rt, batch, out, err)

    # Each item's own request found every whole block short of its last token warmed, under its tenant's salt.
    for line in out:
        usage = line["response"]["body"]["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert usage["prompt_tokens"] > max(PROMPT_CHARS[0], 2 * CHUNK), usage
        assert cached == (usage["prompt_tokens"] - 1) // CHUNK * CHUNK, (line["custom_id"], usage)
        assert usage["completion_tokens"] == MAX_TOKENS
    # No step of the batch computed more than a chunk and its one sampled token (the bucket up to 256); the
    # worker's preflight probe is a few tokens.
    assert after["+Inf"] - before["+Inf"] > sum(PROMPT_CHARS) // CHUNK  # a step a chunk, at least
    assert _steps_over(before, after, 2 * CHUNK) == 0, (before, after)

    # The instrument sees a whole prompt: the same kind of prompt sent whole is one step of all its tokens.
    whole = {**bodies["item-1"], "messages": [{"role": "user", "content": prompt("whole", PROMPT_CHARS[1])}]}
    before = _step_tokens(detailed_engine.url)
    r = requests.post(detailed_engine.url + "/v1/chat/completions", json=whole, timeout=120)
    assert r.status_code == 200, r.text
    assert _steps_over(before, _step_tokens(detailed_engine.url), 512) == 1
