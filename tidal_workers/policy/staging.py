"""Staged prefill: a batch prompt prefilled a chunk per step through the engine's prefix cache.

A stock vLLM puts a newly admitted request's whole prompt into one step (cut only at ``max_num_batched_tokens``),
and on an engine that also serves live traffic that step is an online request's inter-token gap. By the A6000
profile's calibrated T(P, C) a 768-token prompt makes a 27 ms decode step of 40 online requests 4.4x as long; 64
tokens make it 1.12x. So a worker may warm the prompt's KV first: requests for one output token on the prompt's
first c, 2c, ... tokens (``stage_prefixes``), each a step that computes only its c new tokens (the rest are prefix-
cache hits, shared only within the tenant's ``cache_salt``), and then send the item itself, which computes its
last chunk. The tokens computed are the same; only their spread over steps changes. A warmed block that the
engine evicts before the next request is computed again: staging can cost a little time, never an answer.

Which items can be staged (``tokenize_request``): chat and completions bodies whose prompt the engine's
``/tokenize`` renders as the item's own request would (one text prompt, text-only messages, no prompt truncation
or suffix). Pure: the plan and the bodies; ``tidal_workers/staging.py`` sends them.
"""

from __future__ import annotations

import typing as t

from tidal_workers.policy.body import CHAT
from tidal_workers.policy.body import COMPLETIONS

# What a chat body passes to its template, so ``/tokenize`` renders the prompt the item's own request will.
_CHAT_TEMPLATE_FIELDS = (
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template_kwargs",
)


def stage_prefixes(prompt_tokens: int, chunk_tokens: int, whole_tokens: int = 0) -> tuple[int, ...]:
    """The prefix lengths to warm, in order: every multiple of the chunk short of the prompt's end, so each warm-up
    and then the item itself computes one chunk at most. Empty for a chunk of 0 (off), a prompt of one chunk or
    less, or one of ``whole_tokens`` or less (``TIDAL_PREFILL_STAGE_MIN_TOKENS``: a short prompt's one step costs
    the engine less than a warm-up request more). The engine caches whole KV blocks only, so a chunk that is not a
    multiple of its block size leaves each warm-up's last part-block to be computed again by the next."""
    if chunk_tokens <= 0 or prompt_tokens <= whole_tokens:
        return ()
    return tuple(range(chunk_tokens, prompt_tokens, chunk_tokens))


def tokenize_request(url: str, body: t.Mapping[str, t.Any]) -> dict[str, t.Any] | None:
    """The engine's ``/tokenize`` body giving the token ids of the item's prompt, or None where the item is not
    staged: another endpoint, several prompts or a prompt of token ids, media in its messages, or a
    field that changes the prompt after rendering (``truncate_prompt_tokens``, completions' ``suffix``)."""
    if "truncate_prompt_tokens" in body:
        return None
    if url == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(_text_only(m) for m in messages):
            return None
        return {"model": body.get("model"), **{k: body[k] for k in _CHAT_TEMPLATE_FIELDS if k in body}}
    if url == COMPLETIONS and "suffix" not in body:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            fields = {"add_special_tokens": body["add_special_tokens"]} if "add_special_tokens" in body else {}
            return {"model": body.get("model"), "prompt": prompt, **fields}
    return None


def warm_request(model: t.Any, ids: t.Sequence[int]) -> dict[str, t.Any]:
    """The completions body that warms one prefix: its token ids, one output token (its answer is dropped)."""
    return {"model": model, "prompt": list(ids), "max_tokens": 1}


def _text_only(message: t.Any) -> bool:
    if not isinstance(message, dict):
        return False
    content = message.get("content")
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content)
