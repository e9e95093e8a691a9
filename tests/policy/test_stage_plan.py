"""Staged prefill's plan and bodies (tidal_workers.policy.staging): pure, on scripted inputs."""

from __future__ import annotations

import pytest

from tidal_workers.policy.body import CHAT
from tidal_workers.policy.body import COMPLETIONS
from tidal_workers.policy.body import EMBEDDINGS
from tidal_workers.policy.staging import stage_prefixes
from tidal_workers.policy.staging import tokenize_request
from tidal_workers.policy.staging import warm_request


@pytest.mark.parametrize(
    "prompt, chunk, prefixes",
    [
        (768, 128, (128, 256, 384, 512, 640)),  # the item itself computes the last 128
        (700, 128, (128, 256, 384, 512, 640)),  # ... or what is left past the last whole chunk
        (129, 128, (128,)),
        (128, 128, ()),  # one chunk: the item alone computes no more than one
        (40, 128, ()),
        (768, 0, ()),  # off
    ],
)
def test_every_request_of_a_staged_item_computes_one_chunk_at_most(prompt, chunk, prefixes):
    assert stage_prefixes(prompt, chunk) == prefixes
    computed = [b - a for a, b in zip((0, *prefixes), (*prefixes, prompt))]  # each warm-up's new tokens, the item's
    assert sum(computed) == prompt and max(computed) <= (chunk or prompt)


@pytest.mark.parametrize(
    "prompt, whole, prefixes",
    [
        (200, 256, ()),  # the decode-heavy mix's prompt: one step of 200 beats a warm-up of 128 and a step of 72
        (256, 256, ()),
        (257, 256, (128, 256)),  # past the floor, staged as ever
        (900, 256, (128, 256, 384, 512, 640, 768, 896)),
        (200, 0, (128,)),  # no floor: every prompt longer than a chunk
    ],
)
def test_a_prompt_at_or_under_the_floor_goes_whole(prompt, whole, prefixes):
    assert stage_prefixes(prompt, 128, whole) == prefixes


def test_a_chat_item_is_tokenized_with_what_its_template_renders_and_nothing_of_its_sampling():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "chat_template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": True,
        "max_tokens": 9,
        "temperature": 0.2,
        "logprobs": True,
    }
    assert tokenize_request(CHAT, body) == {
        "model": "m",
        "messages": body["messages"],
        "tools": body["tools"],
        "chat_template_kwargs": {"enable_thinking": False},
        "add_generation_prompt": True,
    }


def test_a_completions_item_with_one_text_prompt_is_tokenized_as_its_request_would_be():
    assert tokenize_request(COMPLETIONS, {"model": "m", "prompt": "once", "max_tokens": 3}) == {
        "model": "m",
        "prompt": "once",
    }
    assert tokenize_request(COMPLETIONS, {"model": "m", "prompt": ["once"], "add_special_tokens": False}) == {
        "model": "m",
        "prompt": "once",
        "add_special_tokens": False,
    }


@pytest.mark.parametrize(
    "url, body",
    [
        (EMBEDDINGS, {"model": "m", "input": "a long text"}),
        ("/v1/responses", {"model": "m", "input": "a long text"}),
        (COMPLETIONS, {"model": "m", "prompt": ["one", "two"]}),  # several prompts: several requests, not one
        (COMPLETIONS, {"model": "m", "prompt": [1, 2, 3]}),  # token ids: /tokenize takes text
        (COMPLETIONS, {"model": "m", "prompt": "once", "suffix": "after"}),  # the suffix changes the prompt
        (COMPLETIONS, {"model": "m", "prompt": "once", "truncate_prompt_tokens": 8}),  # cut after rendering
        (CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "truncate_prompt_tokens": 8}),
        (CHAT, {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
        (CHAT, {"model": "m", "messages": "hi"}),
    ],
)
def test_what_tokenize_would_not_render_as_the_item_s_own_request_is_not_staged(url, body):
    assert tokenize_request(url, body) is None


def test_a_warm_up_asks_for_one_token_on_its_prefix_of_ids():
    assert warm_request("m", (5, 6, 7)) == {"model": "m", "prompt": [5, 6, 7], "max_tokens": 1}
