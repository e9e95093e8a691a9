"""What a batch request line's body may ask of the shared engine, and how many tokens it is counted for.

The engine that runs batch work also serves live traffic, so a line may carry only the fields its endpoint
allows (OpenAI's, plus vLLM sampling options that cost nothing extra), within bounds: one choice per request
(``n`` and ``best_of`` at most 1), ``max_tokens`` within the served model's limit, a bounded number of logprobs,
and none of the engine's own fields (``priority``, ``kv_transfer_params``, ``request_id``, guided-decoding
grammars ...). A line that breaks a rule is rejected with an error naming the field; no request is ever changed
silently.

The enqueued-token quota counts each line as its estimated prompt tokens plus its output bound: UTF-8 bytes of
the prompt text over ``prompt_bytes_per_token``, one token per token id, four per message (the chat template's
markers), plus ``max_tokens`` (or the model's limit when the line sets none). No tokenizer is needed, so the API
and the ingest task estimate the same way whatever engine serves the model.
"""

from __future__ import annotations

import dataclasses
import math
import typing as t

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on chat's and Responses' top_logprobs
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on completions' logprobs
TOKENS_PER_MESSAGE = 4

CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
)

#: vLLM sampling options that change what is generated, not what it costs the engine.
_SAMPLING = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "min_tokens",
        "ignore_eos",
        "stop_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "truncate_prompt_tokens",
        "add_special_tokens",
    }
)
_GENERATION = frozenset(
    {
        "model",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "max_tokens",
        "n",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "user",
    }
)
ALLOWED: dict[str, frozenset[str]] = {
    CHAT: _GENERATION
    | _SAMPLING
    | {
        "messages",
        "logprobs",
        "top_logprobs",
        "max_completion_tokens",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "metadata",
        "store",
        "reasoning_effort",
        "service_tier",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
    },
    COMPLETIONS: _GENERATION | _SAMPLING | {"prompt", "best_of", "echo", "logprobs", "suffix"},
    EMBEDDINGS: frozenset({"model", "input", "dimensions", "encoding_format", "user", "truncate_prompt_tokens"}),
    RESPONSES: frozenset(
        {
            "model",
            "input",
            "instructions",
            "max_output_tokens",
            "temperature",
            "top_p",
            "top_logprobs",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "max_tool_calls",
            "text",
            "reasoning",
            "metadata",
            "store",
            "user",
            "previous_response_id",
            "truncation",
            "include",
            "service_tier",
            "background",
            "stream",
        }
    ),
}

#: Fields of the engine's own, named as such in the error (any other unknown field is simply unsupported).
ENGINE_FIELDS = frozenset(
    {
        "priority",
        "kv_transfer_params",
        "request_id",
        "cache_salt",
        "vllm_xargs",
        "prompt_logprobs",
        "logits_processors",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "allowed_token_ids",
        "bad_words",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "chat_template",
        "mm_processor_kwargs",
        "documents",
    }
)

OUTPUT_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_PROMPT_FIELDS = (
    "messages",
    "prompt",
    "input",
    "instructions",
    "suffix",
    "tools",
    "functions",
    "response_format",
    "text",
)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The limits that depend on the deployment (from Settings)."""

    max_output_tokens: int = 32_768  # the served model's limit
    prompt_bytes_per_token: float = 4.0
    max_line_bytes: int = 1024 * 1024  # one request line, as UTF-8 (checked by validate.parse_line)


@dataclasses.dataclass(frozen=True)
class BodyProblem:
    code: str
    param: str
    message: str


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounded(body: t.Mapping[str, t.Any], name: str, low: int, high: int, why: str) -> BodyProblem | None:
    value = body.get(name)
    if value is None:
        return None
    if not _int(value) or not low <= value <= high:
        return BodyProblem(
            "invalid_value",
            f"body.{name}",
            f"Invalid 'body.{name}': must be an integer from {low} to {high} ({why}), got {str(value)[:32]}.",
        )
    return None


def check(endpoint: str, body: t.Mapping[str, t.Any], bounds: Bounds) -> BodyProblem | None:
    """The first rule the body breaks, or None."""
    allowed = ALLOWED.get(endpoint, frozenset())
    for name in body:
        if name in allowed:
            continue
        shown = name[:64]
        if name in ENGINE_FIELDS:
            return BodyProblem(
                "unsupported_parameter",
                f"body.{shown}",
                f"Unsupported parameter: 'body.{shown}' is an engine setting that batch requests may not carry "
                "(Tidal sets the priority itself).",
            )
        return BodyProblem(
            "unsupported_parameter",
            f"body.{shown}",
            f"Unsupported parameter: 'body.{shown}' is not accepted in {endpoint} batch requests.",
        )
    checks = (
        ("n", 1, 1, "batch requests ask for one choice; send one line per sample"),
        ("best_of", 1, 1, "batch requests ask for one choice; send one line per sample"),
        *((name, 1, bounds.max_output_tokens, "the served model's limit") for name in OUTPUT_LIMIT_FIELDS),
        ("top_logprobs", 0, MAX_TOP_LOGPROBS, "at most 20 alternatives per token"),
    )
    for name, low, high, why in checks:
        if problem := _bounded(body, name, low, high, why):
            return problem
    logprobs = body.get("logprobs")
    if endpoint == COMPLETIONS:
        return _bounded(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS, "at most 5 alternatives per token")
    if logprobs is not None and not isinstance(logprobs, bool):
        return BodyProblem("invalid_type", "body.logprobs", "Invalid type for 'body.logprobs': expected a boolean.")
    return None


def _prompt_units(value: t.Any) -> tuple[int, int, int]:
    """(UTF-8 bytes of text, token ids, messages) inside a prompt-bearing field; iterative, any depth."""
    text = ids = messages = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            text += len(item.encode("utf-8", "surrogatepass"))
        elif _int(item):
            ids += 1
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if "role" in item:
                messages += 1
            stack.extend(item.values())
    return text, ids, messages


def estimate_prompt_tokens(body: t.Mapping[str, t.Any], bounds: Bounds) -> int:
    """Prompt tokens, estimated as the module's docstring says (the split decision reads this alone)."""
    text = ids = messages = 0
    for name in _PROMPT_FIELDS:
        if name in body:
            more = _prompt_units(body[name])
            text, ids, messages = text + more[0], ids + more[1], messages + more[2]
    return math.ceil(text / bounds.prompt_bytes_per_token) + ids + TOKENS_PER_MESSAGE * messages


def estimate_tokens(endpoint: str, body: t.Mapping[str, t.Any], bounds: Bounds) -> int:
    """Prompt tokens (estimated, see the module's docstring) plus the most the request may generate."""
    prompt = estimate_prompt_tokens(body, bounds)
    if endpoint == EMBEDDINGS:
        return prompt
    asked = [body[name] for name in OUTPUT_LIMIT_FIELDS if _int(body.get(name))]
    return prompt + (min(asked) if asked else bounds.max_output_tokens)
