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
    assert problem(COMPLETIONS, {"model": "m", "prompt": "x", "best_of": 1, "logprobs": 5, "echo": True}) is None
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
