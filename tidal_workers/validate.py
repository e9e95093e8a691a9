"""Line-by-line validation of a batch input file (JSONL) against its endpoint.

Reads the file as a stream of lines and hands each accepted request to a
callback, so memory holds one line and the custom_ids seen (for duplicates),
never the file: ingest calls it twice, once to check the file and rank its
requests, once to insert them. Error codes follow OpenAI's batch errors
(``errors.data[]`` = {code, line, message, param}); after
``MAX_REPORTED_ERRORS`` further errors are counted but not kept.

Each line is bounded before it costs memory: over ``TIDAL_MAX_LINE_BYTES`` it is not
parsed at all, and JSON nested deeper than ``MAX_JSON_DEPTH`` or with a
container of more than ``MAX_JSON_WIDTH`` entries is refused; the body must
then pass the endpoint's field policy (``tidal_workers.policy.body``), which
also estimates the tokens the line is counted for in the enqueued-token quota.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing as t

from config import Settings
from tidal_workers.policy.body import Bounds
from tidal_workers.policy.body import check as check_body
from tidal_workers.policy.body import estimate_prompt_tokens
from tidal_workers.policy.body import estimate_tokens
from tidal_workers.policy.body import for_engine

MAX_REPORTED_ERRORS = 1000
MAX_JSON_DEPTH = 32  # nested arrays and objects, the line's own object counting 1
MAX_JSON_WIDTH = 100_000  # entries of one array or object
PREFIX_CHARS = 512  # prompt text kept to group requests that share a prefix
MAX_CUSTOM_ID = 512  # items.custom_id
MAX_MODEL = 256  # batches.model
_BOM = b"\xef\xbb\xbf"
_SKIP = 1 << 20  # read size while skipping the rest of a line that is too long
_REQUIRED = ("custom_id", "method", "url", "body")


@dataclasses.dataclass(frozen=True, slots=True)
class ParsedLine:
    line: int  # 1-based line in the file
    custom_id: str
    url: str
    body: str  # the request body as compact JSON text
    model: str
    prefix_key: str  # start of the prompt text; equal keys are claimed next to each other
    tokens: int = 0  # estimated prompt tokens plus the output bound (the enqueued-token quota)
    prompt_tokens: int = 0  # the estimated prompt tokens alone (the split decision)


@dataclasses.dataclass(frozen=True, slots=True)
class LineError:
    code: str
    line: int | None  # None for errors about the whole file
    message: str
    param: str | None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Validation:
    errors: list[LineError]
    model: str | None
    accepted: int = 0  # requests accepted (each handed to the callback)
    error_count: int = 0  # every error found, including those past MAX_REPORTED_ERRORS
    tokens: int = 0  # the accepted lines' estimated tokens


def _reject_constant(name: str) -> t.NoReturn:
    raise ValueError(f"{name} is not JSON")  # NaN/Infinity would reach vLLM as invalid JSON


class NumberOutOfRange(ValueError):
    """A JSON number past a double's range (``1e400``): it would parse to infinity, which is not JSON."""


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise NumberOutOfRange(text[:32])
    return value


_loads = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float).decode
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode  # ASCII: no lone surrogate reaches SQL


def _short(value: str) -> str:
    return value if len(value) <= 64 else value[:61] + "..."


def _storable(value: str, limit: int) -> bool:
    """Fits the column, and PostgreSQL can store it (no NUL, no lone surrogate)."""
    if not value or len(value) > limit or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(value: t.Any, depth: int = 0) -> str:
    """The text inside a prompt, message content (string or parts) or embedding input."""
    if isinstance(value, str):
        return value
    if depth > 3 or value is None:
        return ""
    if isinstance(value, list):
        return "".join(_text(v, depth + 1) for v in value)
    if isinstance(value, dict):  # a content part ({"text"}) or a Responses input message ({"content"})
        return _text(value.get("text", value.get("content")), depth + 1)
    return f"{value} "  # token ids


def prefix_key(body: dict) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        text = "".join(_text(m.get("content")) for m in messages if isinstance(m, dict))
    else:  # completions' prompt; embeddings' and Responses' input, after Responses' instructions
        text = _text(body.get("instructions")) + _text(body.get("prompt", body.get("input")))
    return text[:PREFIX_CHARS]


def _too_large(text: str, limit: int) -> bool:
    """More than ``limit`` bytes of UTF-8 (a character is 1 to 4 bytes, so most lines need no encoding)."""
    if len(text) <= limit // 4:
        return False
    return len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit


def _shape_error(number: int, obj: object) -> LineError | None:
    """Nesting or width past the bounds, found by an iterative walk (no recursion to exhaust)."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            return LineError(
                "json_too_nested", number, f"This line nests JSON deeper than {MAX_JSON_DEPTH} levels.", None
            )
        if len(value) > MAX_JSON_WIDTH:
            return LineError(
                "json_too_wide",
                number,
                f"This line has a JSON array or object of more than {MAX_JSON_WIDTH} entries.",
                None,
            )
        stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return None


DEFAULT_BOUNDS = Bounds()


def parse_line(number: int, text: str, endpoint: str, bounds: Bounds = DEFAULT_BOUNDS) -> ParsedLine | LineError:
    """The checks that need only the line itself: its size and shape, then its fields and their bounds."""
    newline = 2 if text.endswith("\r\n") else 1 if text.endswith("\n") else 0  # the limit counts the request only
    if _too_large(text, bounds.max_line_bytes + newline):
        return LineError(
            "line_too_large",
            number,
            f"This line is larger than {bounds.max_line_bytes} bytes; requests must be smaller.",
            None,
        )
    try:
        obj = _loads(text)
    except NumberOutOfRange as exc:
        return LineError(
            "invalid_json_line",
            number,
            f"This line holds a number out of range ({exc}); JSON numbers must be finite.",
            None,
        )
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        return LineError("invalid_json_line", number, "This line is not parseable as valid JSON.", None)
    if shape := _shape_error(number, obj):
        return shape
    for name in _REQUIRED:
        if obj.get(name) in (None, ""):
            return LineError("missing_required_parameter", number, f"Missing required parameter: '{name}'.", name)
    custom_id, method, url, body = obj["custom_id"], obj["method"], obj["url"], obj["body"]
    if not isinstance(custom_id, str) or not _storable(custom_id, MAX_CUSTOM_ID):
        return LineError(
            "invalid_request", number, f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} characters.", "custom_id"
        )
    if method != "POST":
        return LineError("invalid_request", number, "Only the POST method is supported in the Batch API.", "method")
    if url != endpoint:
        return LineError(
            "invalid_url", number, "The URL provided for this request does not match the batch endpoint.", "url"
        )
    if not isinstance(body, dict):
        return LineError("invalid_request", number, "body must be a JSON object.", "body")
    if body.get("stream") is True:
        return LineError("streaming_unsupported", number, "Streaming is not supported in the Batch API.", "body.stream")
    if body.get("background") is True:  # a Responses request that would answer "queued" and finish elsewhere
        return LineError(
            "invalid_request", number, "Background responses are not supported in the Batch API.", "body.background"
        )
    model = body.get("model")
    if model is None:
        return LineError("invalid_request", number, "Model parameter is required.", "body.model")
    if not isinstance(model, str) or not _storable(model, MAX_MODEL):
        return LineError(
            "invalid_request", number, f"model must be a string of 1 to {MAX_MODEL} characters.", "body.model"
        )
    if problem := check_body(endpoint, body, bounds):
        return LineError(problem.code, number, problem.message, problem.param)
    return ParsedLine(
        number,
        custom_id,
        url,
        _dumps(for_engine(endpoint, body)),
        model,
        prefix_key(body),
        estimate_tokens(endpoint, body, bounds),
        estimate_prompt_tokens(body, bounds),
    )


def bounds_of(settings: Settings) -> Bounds:
    return Bounds(
        max_output_tokens=settings.max_output_tokens,
        prompt_bytes_per_token=settings.prompt_bytes_per_token,
        max_line_bytes=settings.max_line_bytes,
    )


def _lines(f: t.BinaryIO, limit: int) -> t.Iterator[tuple[int, bytes | None]]:
    """(number, line) of each line, or (number, None) for one longer than ``limit``, which is skipped unread: a
    file that is one 200 MB line must not become one 200 MB string."""
    number = 0
    while raw := f.readline(limit + 1):
        number += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = f.readline(_SKIP)
            yield number, None
        else:
            yield number, raw


def validate_file(
    f: t.BinaryIO, endpoint: str, settings: Settings, accept: t.Callable[[ParsedLine], None] = lambda _: None
) -> Validation:
    """Validate every line of the open file ``f``, handing each accepted request to ``accept`` as it is read.

    The file is good only if the result holds no error; ``accept`` has then seen every request, in file order.
    """
    result = Validation(errors=[], model=None)

    def fail(err: LineError) -> None:
        result.error_count += 1
        if len(result.errors) < MAX_REPORTED_ERRORS:
            result.errors.append(err)

    allowed = frozenset(settings.model_list)
    bounds = bounds_of(settings)
    seen: set[str] = set()
    requests = 0
    for number, raw in _lines(f, settings.max_line_bytes):
        if raw is None:
            fail(
                LineError(
                    "line_too_large",
                    number,
                    f"This line is larger than {settings.max_line_bytes} bytes; requests must be smaller.",
                    None,
                )
            )
            continue
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            fail(LineError("invalid_encoding", number, "The file is not valid UTF-8 text.", None))
            break  # a file in another encoding would fail on every line
        if not text.strip():
            continue
        requests += 1
        if requests == settings.max_file_lines + 1:
            fail(
                LineError(
                    "too_many_lines",
                    number,
                    f"A batch input file may hold at most {settings.max_file_lines} requests.",
                    None,
                )
            )
        parsed = parse_line(number, text, endpoint, bounds)
        if isinstance(parsed, LineError):
            fail(parsed)
            continue
        if allowed and parsed.model not in allowed:
            fail(
                LineError(
                    "model_not_found",
                    number,
                    f"The provided model '{_short(parsed.model)}' is not supported by the Batch API.",
                    "body.model",
                )
            )
            continue
        if result.model is None:
            result.model = parsed.model
        elif parsed.model != result.model:
            fail(
                LineError(
                    "mismatched_model",
                    number,
                    f"The model '{_short(parsed.model)}' differs from '{_short(result.model)}' of "
                    "earlier requests; all requests in a batch must use the same model.",
                    "body.model",
                )
            )
            continue
        if parsed.custom_id in seen:
            fail(
                LineError(
                    "duplicate_custom_id",
                    number,
                    f"The custom_id '{_short(parsed.custom_id)}' is used by an earlier request; "
                    "custom_id must be unique within a batch.",
                    "custom_id",
                )
            )
            continue
        seen.add(parsed.custom_id)
        result.accepted += 1
        result.tokens += parsed.tokens
        accept(parsed)
    if requests == 0 and result.error_count == 0:
        fail(LineError("empty_file", None, "The batch input file holds no requests.", None))
    return result
