"""Batch lines of `/v1/responses` requests, validated like OpenAI's (a batch of them on the real engine:
tests/e2e/test_responses_real_engine.py)."""

from __future__ import annotations

import json

from tests.support.api_helpers import RESPONSES
from tests.support.api_helpers import responses_line
from tidal_workers.validate import LineError
from tidal_workers.validate import parse_line


def test_a_responses_line_is_parsed_with_its_prompt_prefix():
    parsed = parse_line(
        1,
        json.dumps(
            responses_line(
                "r",
                instructions="Be brief. ",
                input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            )
        ),
        RESPONSES,
    )
    assert not isinstance(parsed, LineError)
    assert (parsed.url, parsed.model, parsed.prefix_key) == (RESPONSES, "tiny", "Be brief. Hi")
    assert json.loads(parsed.body)["store"] is False  # what the engine is sent: never kept in its memory
    plain = parse_line(1, json.dumps(responses_line("s", input=[{"role": "user", "content": "Hello"}])), RESPONSES)
    assert plain.prefix_key == "Hello"


def test_background_and_streaming_responses_are_line_errors():
    background = parse_line(1, json.dumps(responses_line("b", input="x", background=True)), RESPONSES)
    assert (background.code, background.param) == ("invalid_request", "body.background")
    stream = parse_line(2, json.dumps(responses_line("s", input="x", stream=True)), RESPONSES)
    assert (stream.code, stream.param) == ("streaming_unsupported", "body.stream")
    assert isinstance(parse_line(3, json.dumps(responses_line("c", input="x")), "/v1/chat/completions"), LineError)
