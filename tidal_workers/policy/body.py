"""What a batch request line's body may ask of the shared engine, and how many tokens it is counted for.

The engine that runs batch work also serves live traffic, so a line may carry only the fields its endpoint
allows (OpenAI's, plus vLLM sampling options that cost nothing extra), within bounds: one choice per request
(``n`` and ``best_of`` at most 1), ``max_tokens`` within the served model's limit, a bounded number of logprobs,
and none of the engine's own fields (``priority``, ``kv_transfer_params``, ``request_id``, guided-decoding
grammars ...). A line that breaks a rule is rejected with an error naming the field.

Allowed fields must not reach the same engine features under another name (``policy_problem``):

- no prompt logprobs: completions' ``echo`` with ``logprobs`` is vLLM's ``prompt_logprobs``;
- one response's logprobs are bounded: (``top_logprobs`` + 1) x the output bound at most ``MAX_LOGPROB_ENTRIES``;
- no tenant grammar: ``response_format`` (chat) and ``text.format`` (Responses) are ``text`` or ``json_object``,
  ``tool_choice`` is ``auto`` or ``none`` (``required`` and named tools compile the tools' schemas into a grammar);
  and since some engines' tool parsers compile the declared tools even under ``auto``, ``tools`` is bounded in
  size and depth;
- ``chat_template_kwargs`` carries only ``CHAT_TEMPLATE_KWARGS`` (HF's template call would take ``documents`` or
  ``tools`` from it);
- no media by URL in ``messages`` or ``input``: the engine would fetch it from the GPU node's network (``data:``
  URLs carry the media inline and are allowed);
- no Responses state: ``previous_response_id`` is refused and ``store`` may only be false; ``for_engine`` sets it
  false when a line leaves it out (vLLM's default is true), and docs/api.md says so.

The enqueued-token quota counts each line as its estimated prompt tokens plus its output bound: UTF-8 bytes of
the prompt text over ``prompt_bytes_per_token``, one token per token id, four per message (the chat template's
markers), plus ``max_tokens`` (or the model's limit when the line sets none). No tokenizer is needed, so the API
and the ingest task estimate the same way whatever engine serves the model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing as t

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on chat's and Responses' top_logprobs
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on completions' logprobs
TOKENS_PER_MESSAGE = 4
#: logprob entries one response may carry (one per output token, plus one per alternative): about 88 bytes each in
#: vLLM's chat format, so about 11 MB at most
MAX_LOGPROB_ENTRIES = 131_072
MAX_TOOLS_BYTES = 32 * 1024  # the tools a line declares, as compact JSON
MAX_TOOLS_DEPTH = 16  # nesting inside ``tools`` (a function's JSON schema)
CHAT_TEMPLATE_KWARGS = frozenset({"enable_thinking", "thinking"})
OUTPUT_FORMATS = ("text", "json_object")
TOOL_CHOICES = ("auto", "none")

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
        if problem := _bounded(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS, "at most 5 alternatives per token"):
            return problem
    elif logprobs is not None and not isinstance(logprobs, bool):
        return BodyProblem("invalid_type", "body.logprobs", "Invalid type for 'body.logprobs': expected a boolean.")
    return policy_problem(endpoint, body, bounds)


def _unsupported(param: str, why: str) -> BodyProblem:
    return BodyProblem("unsupported_parameter", param, f"Unsupported value for '{param}': {why}.")


def _logprob_entries(endpoint: str, body: t.Mapping[str, t.Any], bounds: Bounds) -> tuple[str, int, int] | None:
    """(the field, entries per token, output bound) of a line that asks for logprobs; None if it asks for none."""
    if endpoint == COMPLETIONS:
        alternatives, name = body.get("logprobs"), "logprobs"
        if alternatives is None:
            return None
    else:
        alternatives, name = body.get("top_logprobs") or 0, "top_logprobs"
        if body.get("logprobs") is not True and not alternatives:
            return None
    asked = [body[n] for n in OUTPUT_LIMIT_FIELDS if _int(body.get(n))]
    return name, alternatives + 1, min(asked) if asked else bounds.max_output_tokens


def _depth(value: t.Any) -> int:
    """Nesting of arrays and objects (iterative; the line's own shape was bounded before)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _media_url(value: t.Any) -> bool:
    """A content part anywhere in ``value`` names media by URL (``image_url``, ``audio_url``, ``input_image``'s
    ``image_url``, any ``url``), not inline as a ``data:`` URL."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            for key, child in item.items():
                if (key == "url" or key.endswith("_url")) and isinstance(child, str):
                    if child[:5].lower() != "data:":
                        return True
                else:
                    stack.append(child)
    return False


def _allowed_template_kwargs(kwargs: t.Any) -> bool:
    if kwargs is None:
        return True
    return isinstance(kwargs, dict) and all(
        key in CHAT_TEMPLATE_KWARGS and isinstance(value, bool) for key, value in kwargs.items()
    )


def _format_type(value: t.Any) -> t.Any:
    return value.get("type") if isinstance(value, dict) else value


def policy_problem(endpoint: str, body: t.Mapping[str, t.Any], bounds: Bounds) -> BodyProblem | None:
    """The first way an allowed field would reach a feature the policy keeps from batch lines (module docstring)."""
    if endpoint == COMPLETIONS and body.get("echo") is True and body.get("logprobs") is not None:
        return _unsupported("body.echo", "'echo' with 'logprobs' returns logprobs of every prompt token")
    if entries := _logprob_entries(endpoint, body, bounds):
        name, per_token, output = entries
        if per_token * output > MAX_LOGPROB_ENTRIES:
            return BodyProblem(
                "invalid_value",
                f"body.{name}",
                f"Invalid 'body.{name}': ({name} + 1) x the output bound may be at most {MAX_LOGPROB_ENTRIES} "
                f"logprob entries per response; with {name} {per_token - 1}, max_tokens at most "
                f"{MAX_LOGPROB_ENTRIES // per_token}.",
            )
    response_format = body.get("response_format")
    if response_format is not None and _format_type(response_format) not in OUTPUT_FORMATS:
        return _unsupported("body.response_format", "batch requests may ask for 'text' or 'json_object' only")
    text = body.get("text")
    text_format = text.get("format") if endpoint == RESPONSES and isinstance(text, dict) else None
    if text_format is not None and _format_type(text_format) not in OUTPUT_FORMATS:
        return _unsupported("body.text.format", "batch requests may ask for 'text' or 'json_object' only")
    for name in ("tool_choice", "function_call"):
        if body.get(name) is not None and body[name] not in TOOL_CHOICES:
            return _unsupported(f"body.{name}", "batch requests may use 'auto' or 'none' (no forced tool calls)")
    for name in ("tools", "functions"):
        if body.get(name) is None:
            continue
        if len(json.dumps(body[name], separators=(",", ":"))) > MAX_TOOLS_BYTES or _depth(body[name]) > MAX_TOOLS_DEPTH:
            return BodyProblem(
                "invalid_value",
                f"body.{name}",
                f"Invalid 'body.{name}': at most {MAX_TOOLS_BYTES} bytes of JSON nested at most {MAX_TOOLS_DEPTH} "
                "deep in a batch request.",
            )
    if not _allowed_template_kwargs(body.get("chat_template_kwargs")):
        return _unsupported(
            "body.chat_template_kwargs",
            f"batch requests may set only {', '.join(sorted(CHAT_TEMPLATE_KWARGS))}, each true or false",
        )
    for name in ("messages", "input"):
        if _media_url(body.get(name)):
            return _unsupported(
                f"body.{name}", "media by URL is not fetched for batch requests; send it inline as a data: URL"
            )
    if endpoint == RESPONSES:
        if body.get("previous_response_id") is not None:
            return _unsupported("body.previous_response_id", "batch responses are not stored, so none can follow one")
        if body.get("store") not in (None, False):
            return _unsupported("body.store", "batch responses are not stored; 'store' may only be false")
    return None


def for_engine(endpoint: str, body: dict[str, t.Any]) -> dict[str, t.Any]:
    """The body the engine is sent: the line's, with Responses' ``store`` false (vLLM's default is true)."""
    if endpoint == RESPONSES and "store" not in body:
        return {**body, "store": False}
    return body


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
