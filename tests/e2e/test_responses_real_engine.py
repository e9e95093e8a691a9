"""A batch of `/v1/responses` requests on the real engine: run, and written as OpenAI writes them."""

from __future__ import annotations

import json

import openai
import pytest
import requests
from openai.types.responses import Response

from tests.support.api_helpers import RESPONSES
from tests.support.api_helpers import responses_line
from tests.support.worker_helpers import QUICK
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import settled


@pytest.fixture
def settings(settings, tiny_engine):
    return settings.replace(**QUICK).replace(vllm_url=tiny_engine.url, request_timeout_seconds=120.0)


@pytest.mark.engine
def test_a_responses_batch_runs_on_the_real_engine(rt, live_api, worker, tiny_engine):
    lines = [
        responses_line("text", input="Hello there", max_output_tokens=6),
        responses_line(
            "messages", instructions="Be brief.", input=[{"role": "user", "content": "Hi"}], max_output_tokens=4
        ),
        responses_line(
            "parts",
            input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            max_output_tokens=5,
        ),
        responses_line("bad-temperature", input="x", max_output_tokens=4, temperature=-1.0),
    ]
    client = openai.OpenAI(base_url=live_api.url + "/v1", api_key="acme-key", max_retries=0)
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    f = client.files.create(file=("responses.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=RESPONSES, completion_window="24h")
    assert (batch.endpoint, batch.status, batch.request_counts.total) == (RESPONSES, "in_progress", 4)

    with worker():
        b, out, err = settled(rt, batch.id, timeout=180)
    assert_exactly_once(rt, batch.id, out, err)
    assert (b.completed, b.failed) == (3, 1)

    usage = {"input": 0, "output": 0}
    for out_line in out:
        assert set(out_line) == {"id", "custom_id", "response", "error"} and out_line["error"] is None
        response = out_line["response"]
        assert response["status_code"] == 200
        body = Response.model_validate(response["body"])  # the official SDK's Response type reads it
        assert body.object == "response" and body.model == tiny_engine.model and body.output
        assert response["request_id"] == body.id and body.id.startswith("resp_")
        assert 1 <= body.usage.output_tokens <= body.max_output_tokens
        assert body.usage.total_tokens == body.usage.input_tokens + body.usage.output_tokens
        usage["input"] += body.usage.input_tokens
        usage["output"] += body.usage.output_tokens
    assert {x["custom_id"] for x in out} == {"text", "messages", "parts"}

    # The engine's 4xx is the request's own fault: an error-file line with the engine's status and body.
    (failed,) = err
    assert failed["custom_id"] == "bad-temperature" and failed["response"]["status_code"] == 400
    assert "temperature" in failed["response"]["body"]["error"]["message"]

    # The batch's usage is OpenAI's batch usage object, summed from the responses' usage.
    done = client.batches.retrieve(batch.id)
    assert (done.usage.input_tokens, done.usage.output_tokens) == (usage["input"], usage["output"])
    assert done.usage.total_tokens == usage["input"] + usage["output"]
    text = requests.get(
        f"{live_api.url}/v1/files/{done.output_file_id}/content", headers={"Authorization": "Bearer acme-key"}
    ).text
    assert [json.loads(x)["custom_id"] for x in text.splitlines()] == ["text", "messages", "parts"]
