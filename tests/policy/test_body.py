"""The body policy alone (pure): each endpoint's allowlist and bounds, and the token estimate."""

from __future__ import annotations

import pytest

from tidal_workers.policy.body import ALLOWED
from tidal_workers.policy.body import CHAT
from tidal_workers.policy.body import COMPLETIONS
from tidal_workers.policy.body import EMBEDDINGS
from tidal_workers.policy.body import ENGINE_FIELDS
from tidal_workers.policy.body import RESPONSES
from tidal_workers.policy.body import Bounds
from tidal_workers.policy.body import check
from tidal_workers.policy.body import estimate_tokens
from tidal_workers.policy.body import for_engine

BOUNDS = Bounds(max_output_tokens=4096, prompt_bytes_per_token=4.0)
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def problem(endpoint: str, body: dict) -> tuple[str, str] | None:
    found = check(endpoint, body, BOUNDS)
    return (found.code, found.param) if found else None


def test_openai_bodies_with_harmless_vllm_sampling_options_pass():
    assert problem(CHAT, {**CHAT_BODY, "max_tokens": 4096, "n": 1, "logprobs": True, "top_logprobs": 20}) is None
    assert (
        problem(CHAT, {**CHAT_BODY, "ignore_eos": True, "top_k": 5, "response_format": {"type": "json_object"}}) is None
    )
    assert problem(COMPLETIONS, {"model": "m", "prompt": "x", "best_of": 1, "logprobs": 5}) is None
    assert problem(COMPLETIONS, {"model": "m", "prompt": "x", "echo": True}) is None
    assert problem(EMBEDDINGS, {"model": "m", "input": ["a", "b"], "encoding_format": "float"}) is None
    assert problem(RESPONSES, {"model": "m", "input": "x", "max_output_tokens": 10, "instructions": "be brief"}) is None


@pytest.mark.parametrize("field", sorted(ENGINE_FIELDS))
def test_engine_fields_are_refused_on_every_endpoint_naming_the_field(field):
    for endpoint in ALLOWED:
        found = check(endpoint, {"model": "m", field: 1}, BOUNDS)
        assert found is not None and found.code == "unsupported_parameter" and found.param == f"body.{field}"
        assert "engine setting" in found.message


@pytest.mark.parametrize(
    ("endpoint", "extra", "expected"),
    [
        (CHAT, {"n": 8}, ("invalid_value", "body.n")),
        (CHAT, {"n": True}, ("invalid_value", "body.n")),
        (COMPLETIONS, {"best_of": 2}, ("invalid_value", "body.best_of")),
        (CHAT, {"best_of": 1}, ("unsupported_parameter", "body.best_of")),  # not a chat field at all
        (CHAT, {"max_tokens": 4097}, ("invalid_value", "body.max_tokens")),
        (CHAT, {"max_completion_tokens": 0}, ("invalid_value", "body.max_completion_tokens")),
        (RESPONSES, {"max_output_tokens": 10**9}, ("invalid_value", "body.max_output_tokens")),
        (CHAT, {"top_logprobs": 21}, ("invalid_value", "body.top_logprobs")),
        (CHAT, {"logprobs": 5}, ("invalid_type", "body.logprobs")),
        (COMPLETIONS, {"logprobs": 6}, ("invalid_value", "body.logprobs")),
        (EMBEDDINGS, {"max_tokens": 5}, ("unsupported_parameter", "body.max_tokens")),
        (CHAT, {"frobnicate": 1}, ("unsupported_parameter", "body.frobnicate")),
    ],
)
def test_bounds_and_unknown_fields(endpoint, extra, expected):
    base = {"model": "m", "prompt": "x"} if endpoint == COMPLETIONS else {"model": "m", "input": "x"}
    body = {**(CHAT_BODY if endpoint == CHAT else base), **extra}
    assert problem(endpoint, body) == expected


def test_the_estimate_counts_text_bytes_token_ids_messages_and_the_output_bound():
    body = {"model": "m", "messages": [{"role": "user", "content": "é" * 10}, {"role": "assistant", "content": "ok"}]}
    text = 4 + 20 + 9 + 2  # "user", 10 two-byte characters, "assistant", "ok"
    assert estimate_tokens(CHAT, body, BOUNDS) == -(-text // 4) + 2 * 4 + 4096
    assert estimate_tokens(CHAT, {**body, "max_tokens": 7, "max_completion_tokens": 9}, BOUNDS) == 9 + 8 + 7
    assert estimate_tokens(COMPLETIONS, {"model": "m", "prompt": [1, 2, 3], "max_tokens": 1}, BOUNDS) == 3 + 1
    tools = {
        "model": "m",
        "messages": [],
        "tools": [{"type": "function", "function": {"name": "x" * 40}}],
        "max_tokens": 1,
    }
    assert estimate_tokens(CHAT, tools, BOUNDS) == 12 + 1  # tool definitions are prompt text too ("function" + 40)


LONG = Bounds(max_output_tokens=32_768)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
HTTP_IMAGE = {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}
DATA_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _user(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}]


@pytest.mark.parametrize(
    ("endpoint", "extra", "expected"),
    [
        # prompt logprobs under another name
        (COMPLETIONS, {"echo": True, "logprobs": 0}, ("unsupported_parameter", "body.echo")),
        # one response's logprobs: (alternatives + 1) x the output bound <= 131,072
        (CHAT, {"logprobs": True, "top_logprobs": 20}, ("invalid_value", "body.top_logprobs")),  # x 32,768
        (CHAT, {"logprobs": True, "top_logprobs": 20, "max_tokens": 6242}, ("invalid_value", "body.top_logprobs")),
        (CHAT, {"logprobs": True, "top_logprobs": 20, "max_tokens": 6241}, None),
        (CHAT, {"logprobs": True}, None),  # one entry per token
        (COMPLETIONS, {"logprobs": 5}, ("invalid_value", "body.logprobs")),
        (RESPONSES, {"top_logprobs": 20, "max_output_tokens": 32_000}, ("invalid_value", "body.top_logprobs")),
        # no tenant grammar
        (
            CHAT,
            {"response_format": {"type": "json_schema", "json_schema": {}}},
            ("unsupported_parameter", "body.response_format"),
        ),
        (CHAT, {"response_format": {"type": "structural_tag"}}, ("unsupported_parameter", "body.response_format")),
        (CHAT, {"response_format": {"type": "json_object"}}, None),
        (
            RESPONSES,
            {"text": {"format": {"type": "json_schema", "schema": {}}}},
            ("unsupported_parameter", "body.text.format"),
        ),
        (RESPONSES, {"text": {"format": {"type": "text"}}}, None),
        (CHAT, {"tools": [TOOL], "tool_choice": "required"}, ("unsupported_parameter", "body.tool_choice")),
        (
            CHAT,
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            ("unsupported_parameter", "body.tool_choice"),
        ),
        (
            RESPONSES,
            {"tools": [TOOL], "tool_choice": {"type": "function", "name": "f"}},
            ("unsupported_parameter", "body.tool_choice"),
        ),
        (
            CHAT,
            {"functions": [TOOL["function"]], "function_call": {"name": "f"}},
            ("unsupported_parameter", "body.function_call"),
        ),
        (CHAT, {"tools": [TOOL], "tool_choice": "auto"}, None),
        (CHAT, {"tools": [{**TOOL, "description": "d" * 33_000}]}, ("invalid_value", "body.tools")),
        (
            CHAT,
            {"tools": [{**TOOL, "function": {"name": "f", "parameters": _nested(8)}}]},
            ("invalid_value", "body.tools"),
        ),
        (CHAT, {"tools": [{**TOOL, "function": {"name": "f", "parameters": _nested(5)}}]}, None),
        # chat_template_kwargs: only what the allowlist names, as booleans
        (
            CHAT,
            {"chat_template_kwargs": {"documents": [{"text": "x"}]}},
            ("unsupported_parameter", "body.chat_template_kwargs"),
        ),
        (CHAT, {"chat_template_kwargs": {"tools": []}}, ("unsupported_parameter", "body.chat_template_kwargs")),
        (
            CHAT,
            {"chat_template_kwargs": {"enable_thinking": "yes"}},
            ("unsupported_parameter", "body.chat_template_kwargs"),
        ),
        (CHAT, {"chat_template_kwargs": {"enable_thinking": False}}, None),
        # media by URL: the engine would fetch it from the GPU node's network
        (CHAT, {"messages": _user(HTTP_IMAGE)}, ("unsupported_parameter", "body.messages")),
        (
            CHAT,
            {"messages": _user({"type": "image_url", "image_url": "https://x.test/a.png"})},
            ("unsupported_parameter", "body.messages"),
        ),
        (
            CHAT,
            {"messages": _user({"type": "audio_url", "audio_url": {"url": "file:///etc/passwd"}})},
            ("unsupported_parameter", "body.messages"),
        ),
        (
            CHAT,
            {"messages": _user({"type": "video_url", "video_url": {"url": "https://x.test/v.mp4"}})},
            ("unsupported_parameter", "body.messages"),
        ),
        (CHAT, {"messages": _user(DATA_IMAGE)}, None),
        (
            RESPONSES,
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://10.0.0.1/"}]}]},
            ("unsupported_parameter", "body.input"),
        ),
        (
            RESPONSES,
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "http://10.0.0.1/"}]}]},
            ("unsupported_parameter", "body.input"),
        ),
        # no Responses state
        (RESPONSES, {"previous_response_id": "resp_1"}, ("unsupported_parameter", "body.previous_response_id")),
        (RESPONSES, {"store": True}, ("unsupported_parameter", "body.store")),
        (RESPONSES, {"store": False}, None),
    ],
)
def test_allowed_fields_do_not_reach_what_the_policy_keeps_away(endpoint, extra, expected):
    base = {"model": "m", "prompt": "x"} if endpoint == COMPLETIONS else {"model": "m", "input": "x"}
    body = {**(CHAT_BODY if endpoint == CHAT else base), **extra}
    found = check(endpoint, body, LONG)
    assert ((found.code, found.param) if found else None) == expected, found


def test_responses_are_sent_with_store_off():
    assert for_engine(RESPONSES, {"model": "m", "input": "x"}) == {"model": "m", "input": "x", "store": False}
    assert for_engine(RESPONSES, {"model": "m", "store": False}) == {"model": "m", "store": False}
    assert for_engine(CHAT, CHAT_BODY) == CHAT_BODY
