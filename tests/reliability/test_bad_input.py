"""The bad-input corpus: each named case gets its status and OpenAI code over real HTTP; nothing is half-written.

Kinds of case:

- ``request``: a bad request; no file or batch appears.
- ``ingest``: the upload is accepted, then validation fails the batch it creates:
  the batch is ``failed`` with the line error, holds no items in SQL and nothing is queued.
- ``accepted``: odd but valid input (blank lines, a BOM); the batch is ``in_progress``.

After every case the API listings show exactly the files and batches the case
meant to create, and the blob directory holds exactly the blobs of live files,
with no ``.part`` left behind.
"""

from __future__ import annotations

import dataclasses
import json
import typing as t

import pytest
import requests
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy import update

from tidal_workers import keys
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import Item

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MAX_FILE_BYTES, MAX_UPLOAD_BYTES, MAX_FILE_LINES = 400_000, 800_000, 5
MAX_LINE_BYTES, MAX_OUTPUT_TOKENS = 250_000, 1000
#: globex runs at tiny quotas, so a case can reach each one in a request or two (acme keeps the defaults,
#: but for its enqueued tokens: a few lines without max_tokens, each counted at MAX_OUTPUT_TOKENS, pass it).
TENANT_LIMITS = {"acme": {"enqueued_tokens": 5_000}, "globex": {"stored_bytes": 1_000, "open_batches": 1}}


@pytest.fixture
def settings(settings):
    """Limits shrunk so over-limit files are small; two allowed models (mixed models, model_not_found)."""
    return settings.replace(
        max_file_bytes=MAX_FILE_BYTES,
        max_upload_bytes=MAX_UPLOAD_BYTES,
        max_file_lines=MAX_FILE_LINES,
        max_line_bytes=MAX_LINE_BYTES,
        max_output_tokens=MAX_OUTPUT_TOKENS,
        tenant_limits=json.dumps(TENANT_LIMITS),
        models="tiny,tiny-2",
    )


def line(custom_id: str = "r1", *, method: str = "POST", url: str = CHAT, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": method,
        "url": url,
        "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body},
    }


def jsonl(*lines: dict | str | bytes) -> bytes:
    """Dicts become JSON lines; str and bytes are written as they are (for broken lines)."""
    out = b""
    for item in lines:
        out += item if isinstance(item, bytes) else (item if isinstance(item, str) else json.dumps(item)).encode()
        out += b"\n"
    return out


GOOD = jsonl(line("r1"), line("r2"))


class Client:
    """acme's HTTP session against the live server, remembering what the case itself created."""

    def __init__(self, url: str, rt, key: str = "acme-key"):
        self.url, self.rt = url, rt
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {key}"
        self.files: set[str] = set()
        self.batches: set[str] = set()

    def globex(self) -> Client:
        """globex's session (tiny quotas); what it creates is not acme's to see."""
        return Client(self.url, self.rt, "globex-key")

    def send(self, method: str, path: str, **kw) -> requests.Response:
        return self.http.request(method, self.url + path, timeout=30, **kw)

    def upload(self, content: bytes, purpose: str = "batch", **kw) -> str:
        r = self.send("POST", "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": purpose}, **kw)
        assert r.status_code == 200, r.text
        self.files.add(r.json()["id"])
        return r.json()["id"]

    def create(self, **body) -> requests.Response:
        return self.send("POST", "/v1/batches", json={"endpoint": CHAT, "completion_window": "24h", **body})

    def batch_of(self, content: bytes, endpoint: str = CHAT) -> requests.Response:
        """Upload ``content`` and create a batch from it: the path of every file-validation case."""
        r = self.create(input_file_id=self.upload(content), endpoint=endpoint)
        if r.status_code == 200:
            self.batches.add(r.json()["id"])
        return r

    def batch_with_status(self, status: str) -> str:
        r = self.batch_of(GOOD)
        with self.rt.store.transaction() as s:
            s.execute(update(Batch).where(Batch.id == r.json()["id"]).values(status=status))
        return r.json()["id"]

    def visible(self) -> tuple[set[str], set[str]]:
        files = self.send("GET", "/v1/files").json()["data"]
        batches = self.send("GET", "/v1/batches", params={"limit": 100}).json()["data"]
        return {f["id"] for f in files}, {b["id"] for b in batches}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    call: t.Callable[[Client], requests.Response]
    status: int
    code: str | None = None  # the error code of a 4xx, or the line error of an `ingest` case
    kind: str = "request"  # request | ingest | accepted

    def __str__(self) -> str:
        return self.name


def request(name, call, status, code=None) -> Case:
    return Case(name, call, status, code)


def ingest(name, content: bytes, code: str, endpoint: str = CHAT) -> Case:
    return Case(name, lambda c: c.batch_of(content, endpoint), 200, code, "ingest")


def accepted(name, content: bytes) -> Case:
    return Case(name, lambda c: c.batch_of(content), 200, None, "accepted")


def multipart(c: Client, **parts) -> requests.Response:
    return c.send("POST", "/v1/files", files=parts)


def metadata(meta) -> t.Callable[[Client], requests.Response]:
    return lambda c: c.create(input_file_id=c.upload(GOOD), metadata=meta)


def cancel_of(status: str) -> t.Callable[[Client], requests.Response]:
    return lambda c: c.send("POST", f"/v1/batches/{c.batch_with_status(status)}/cancel")


def completion_line(**body) -> bytes:
    return jsonl(
        {
            "custom_id": "r1",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "tiny", "prompt": "hi", **body},
        }
    )


def responses_line(**body) -> bytes:
    return jsonl(
        {"custom_id": "r1", "method": "POST", "url": RESPONSES, "body": {"model": "tiny", "input": "hi", **body}}
    )


def nested(depth: int) -> object:
    value: object = "deep"
    for _ in range(depth):
        value = [value]
    return value


def compact(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def expires_after(anchor: str | None, seconds: str) -> t.Callable[[Client], requests.Response]:
    fields = {"file": ("a.jsonl", GOOD), "purpose": (None, "batch"), "expires_after[seconds]": (None, seconds)}
    if anchor is not None:
        fields["expires_after[anchor]"] = (None, anchor)
    return lambda c: multipart(c, **fields)


def output_expires_after(value: object) -> t.Callable[[Client], requests.Response]:
    return lambda c: c.create(input_file_id=c.upload(GOOD), output_expires_after=value)


MULTIPART_X = {"Content-Type": "multipart/form-data; boundary=x"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
META = "http://169.254.169.254/latest/meta-data/"  # what a media fetch from the GPU node could reach
TRAVERSAL, SQL = "../../../etc/passwd", "file-x' OR '1'='1' --"
BOM = b"\xef\xbb\xbf"

CASES = [
    # --- uploads refused before anything is stored
    request(
        "upload_json_content_type",
        lambda c: c.send("POST", "/v1/files", json={"purpose": "batch"}),
        415,
        "unsupported_media_type",
    ),
    request(
        "upload_text_plain",
        lambda c: c.send("POST", "/v1/files", data=GOOD, headers={"Content-Type": "text/plain"}),
        415,
        "unsupported_media_type",
    ),
    request(
        "upload_urlencoded_form",
        lambda c: c.send("POST", "/v1/files", data={"purpose": "batch", "file": "x"}),
        415,
        "unsupported_media_type",
    ),
    request(
        "upload_missing_file_field", lambda c: multipart(c, purpose=(None, "batch")), 400, "missing_required_parameter"
    ),
    request(
        "upload_missing_purpose_field",
        lambda c: multipart(c, file=("a.jsonl", GOOD)),
        400,
        "missing_required_parameter",
    ),
    request(
        "upload_unknown_purpose",
        lambda c: multipart(c, file=("a.jsonl", GOOD), purpose=(None, "batch_output")),
        400,
        "invalid_value",
    ),
    request(
        "upload_multipart_without_boundary",
        lambda c: c.send("POST", "/v1/files", data=b"garbage", headers={"Content-Type": "multipart/form-data"}),
        400,
        "missing_required_parameter",
    ),
    request(  # RFC 2231: the boundary parses to a non-ASCII character, which cannot delimit bytes
        "upload_multipart_rfc2231_boundary",
        lambda c: c.send(
            "POST",
            "/v1/files",
            data=b"--x\r\n",
            headers={"Content-Type": "multipart/form-data; boundary*=UTF-8''%E2%82%AC"},
        ),
        400,
        "missing_required_parameter",
    ),
    request(  # junk where the first boundary should be: the decoder's buffer stops at MAX_BUFFER_BYTES
        "upload_multipart_preamble_past_the_buffer_bound",
        lambda c: c.send("POST", "/v1/files", data=b"j" * 600_000, headers=MULTIPART_X),
        400,
        "missing_required_parameter",
    ),
    request(  # a part's headers that never end (no blank line): bounded the same way
        "upload_multipart_part_headers_past_the_buffer_bound",
        lambda c: c.send(
            "POST",
            "/v1/files",
            data=b'--x\r\nContent-Disposition: form-data; name="file"; filename="a"\r\nX-Pad: ' + b"p" * 600_000,
            headers=MULTIPART_X,
        ),
        400,
        "missing_required_parameter",
    ),
    request(
        "upload_multipart_truncated",
        lambda c: c.send(
            "POST",
            "/v1/files",
            headers={"Content-Type": "multipart/form-data; boundary=x"},
            data=b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--x\r\n'
            b'Content-Disposition: form-data; name="file"; filename="a"\r\n\r\n{"custom',
        ),
        400,
        "missing_required_parameter",
    ),
    request(
        "upload_over_batch_size_limit",
        lambda c: multipart(c, file=("a.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose=(None, "batch")),
        413,
        "file_too_large",
    ),
    request(
        "upload_over_any_purpose_limit",
        lambda c: multipart(c, file=("a.bin", b"x" * (MAX_UPLOAD_BYTES + 1)), purpose=(None, "user_data")),
        413,
        "file_too_large",
    ),
    request(
        "upload_over_request_size_limit",
        lambda c: multipart(c, file=("a.bin", b"x" * (MAX_UPLOAD_BYTES + 128 * 1024)), purpose=(None, "user_data")),
        413,
        "file_too_large",
    ),
    request(
        "upload_over_line_limit",
        lambda c: multipart(
            c, file=("a.jsonl", jsonl(*(line(f"r{i}") for i in range(MAX_FILE_LINES + 1)))), purpose=(None, "batch")
        ),
        400,
        "too_many_lines",
    ),
    # --- uploads accepted, the batch fails validation: failed, errors, no items, nothing queued
    ingest("truncated_json_line", jsonl(line("r1"), json.dumps(line("r2"))[:30]), "invalid_json_line"),
    ingest("single_quoted_json", jsonl("{'custom_id': 'r1'}"), "invalid_json_line"),
    ingest("json_array_line", jsonl("[1, 2]"), "invalid_json_line"),
    ingest(
        "number_out_of_range",
        jsonl(json.dumps(line("r1", temperature=1.0)).replace("1.0", "1e400")),
        "invalid_json_line",
    ),
    ingest("nan_in_body", jsonl(json.dumps(line("r1")).replace('"hi"', "NaN")), "invalid_json_line"),
    ingest("two_objects_on_one_line", jsonl(json.dumps(line("r1")) + json.dumps(line("r2"))), "invalid_json_line"),
    ingest("non_utf8_bytes", jsonl(line("r1"), b'{"custom_id": "\xff\xfe"}'), "invalid_encoding"),
    ingest("utf16_file", json.dumps(line("r1")).encode("utf-16") + b"\n", "invalid_encoding"),
    ingest("empty_file", b"", "empty_file"),
    ingest("only_blank_lines", b"\n  \n\t\n", "empty_file"),
    ingest("duplicate_custom_id", jsonl(line("same"), line("same")), "duplicate_custom_id"),
    ingest("wrong_url", jsonl(line("r1", url="/v1/embeddings")), "invalid_url"),
    ingest("wrong_method", jsonl(line("r1", method="GET")), "invalid_request"),
    ingest("stream_true", jsonl(line("r1", stream=True)), "streaming_unsupported"),
    ingest("background_response", jsonl(line("r1", background=True)), "invalid_request"),
    ingest(
        "mixed_models",
        jsonl(line("r1"), {**line("r2"), "body": {**line()["body"], "model": "tiny-2"}}),
        "mismatched_model",
    ),
    ingest("unknown_model", jsonl({**line("r1"), "body": {**line()["body"], "model": "gpt-x"}}), "model_not_found"),
    ingest(
        "missing_custom_id", jsonl({k: v for k, v in line().items() if k != "custom_id"}), "missing_required_parameter"
    ),
    ingest("missing_body", jsonl({k: v for k, v in line().items() if k != "body"}), "missing_required_parameter"),
    ingest("custom_id_not_a_string", jsonl({**line(), "custom_id": 7}), "invalid_request"),
    ingest("body_not_an_object", jsonl({**line(), "body": "hi"}), "invalid_request"),
    ingest("missing_model", jsonl({**line(), "body": {"messages": []}}), "invalid_request"),
    # --- the body policy: fields the shared engine must not be asked for, and bounds
    ingest("n_above_1", jsonl(line("r1", n=8)), "invalid_value"),
    ingest("best_of_in_chat", jsonl(line("r1", best_of=2)), "unsupported_parameter"),
    ingest("best_of_above_1", completion_line(best_of=2), "invalid_value", endpoint="/v1/completions"),
    ingest("completion_logprobs_above_5", completion_line(logprobs=6), "invalid_value", endpoint="/v1/completions"),
    ingest(
        "kv_transfer_params", jsonl(line("r1", kv_transfer_params={"do_remote_prefill": True})), "unsupported_parameter"
    ),
    ingest("priority_in_body", jsonl(line("r1", priority=0)), "unsupported_parameter"),
    ingest("request_id_in_body", jsonl(line("r1", request_id="mine")), "unsupported_parameter"),
    ingest("guided_grammar", jsonl(line("r1", guided_json={"type": "object"})), "unsupported_parameter"),
    ingest("prompt_logprobs", jsonl(line("r1", prompt_logprobs=5)), "unsupported_parameter"),
    ingest("unknown_body_field", jsonl(line("r1", temperature_boost=2)), "unsupported_parameter"),
    ingest("max_tokens_above_the_model_limit", jsonl(line("r1", max_tokens=MAX_OUTPUT_TOKENS + 1)), "invalid_value"),
    ingest("max_tokens_zero", jsonl(line("r1", max_tokens=0)), "invalid_value"),
    ingest("max_completion_tokens_as_text", jsonl(line("r1", max_completion_tokens="100")), "invalid_value"),
    ingest("top_logprobs_above_20", jsonl(line("r1", logprobs=True, top_logprobs=21)), "invalid_value"),
    # --- the body policy: allowed fields that would reach what it keeps away (issue 37, M1)
    ingest(
        "echo_with_logprobs",
        completion_line(echo=True, logprobs=1),
        "unsupported_parameter",
        endpoint="/v1/completions",
    ),
    ingest(
        "response_format_json_schema",
        jsonl(line("r1", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})),
        "unsupported_parameter",
    ),
    ingest(
        "response_format_structural_tag",
        jsonl(line("r1", response_format={"type": "structural_tag", "format": {}})),
        "unsupported_parameter",
    ),
    ingest(
        "tool_choice_required",
        jsonl(line("r1", tools=[TOOL], tool_choice="required")),
        "unsupported_parameter",
    ),
    ingest(
        "tool_choice_named",
        jsonl(line("r1", tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}})),
        "unsupported_parameter",
    ),
    ingest(
        "chat_template_kwargs_documents",
        jsonl(line("r1", chat_template_kwargs={"documents": [{"title": "t", "text": "x"}]})),
        "unsupported_parameter",
    ),
    ingest(
        "image_by_url",
        jsonl(line("r1", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": META}}]}])),
        "unsupported_parameter",
    ),
    ingest(
        "responses_input_image_by_url",
        responses_line(input=[{"role": "user", "content": [{"type": "input_image", "image_url": META}]}]),
        "unsupported_parameter",
        endpoint=RESPONSES,
    ),
    ingest(
        "responses_text_format_json_schema",
        responses_line(text={"format": {"type": "json_schema", "name": "x", "schema": {}}}),
        "unsupported_parameter",
        endpoint=RESPONSES,
    ),
    ingest(
        "responses_previous_response_id",
        responses_line(previous_response_id="resp_abc"),
        "unsupported_parameter",
        endpoint=RESPONSES,
    ),
    ingest("responses_store_true", responses_line(store=True), "unsupported_parameter", endpoint=RESPONSES),
    ingest("chat_logprobs_not_a_boolean", jsonl(line("r1", logprobs=3)), "invalid_type"),
    # --- lines bounded before they cost memory
    ingest("line_over_the_size_limit", jsonl(line("r1", user="x" * MAX_LINE_BYTES)), "line_too_large"),
    ingest(  # fewer characters than the limit, more bytes (UTF-8, not \u escapes)
        "line_of_multibyte_text_over_the_limit",
        json.dumps(line("r1", user="é" * (MAX_LINE_BYTES // 2)), ensure_ascii=False).encode() + b"\n",
        "line_too_large",
    ),
    ingest("json_nested_too_deep", jsonl(line("r1", metadata=nested(40))), "json_too_nested"),
    ingest("json_array_too_wide", compact(line("r1", stop_token_ids=[0] * 100_001)), "json_too_wide"),
    # --- the enqueued-token quota (acme: 5,000; each line without max_tokens counts MAX_OUTPUT_TOKENS)
    ingest("enqueued_tokens_over_the_quota", jsonl(*(line(f"r{i}") for i in range(5))), "token_limit_exceeded"),
    # --- odd but valid
    accepted("blank_lines_between_requests", b"\n" + jsonl(line("r1")) + b"\n  \n" + jsonl(line("r2"))),
    accepted("utf8_bom", BOM + GOOD),
    accepted("crlf_line_ends", GOOD.replace(b"\n", b"\r\n")),
    accepted("no_final_newline", GOOD.rstrip(b"\n")),
    # --- POST /v1/batches refused: no batch appears
    request(
        "batch_body_not_json",
        lambda c: c.send("POST", "/v1/batches", data=b"input_file_id=f", headers={"Content-Type": "application/json"}),
        400,
        "invalid_json",
    ),
    request(
        "batch_body_truncated_json",
        lambda c: c.send(
            "POST", "/v1/batches", data=b'{"input_file_id": "f', headers={"Content-Type": "application/json"}
        ),
        400,
        "invalid_json",
    ),
    request(
        "batch_body_json_array",
        lambda c: c.send("POST", "/v1/batches", json=[{"input_file_id": "f"}]),
        400,
        "invalid_json",
    ),
    request("batch_missing_input_file_id", lambda c: c.create(), 400, "missing_required_parameter"),
    request(
        "batch_missing_endpoint",
        lambda c: c.send("POST", "/v1/batches", json={"input_file_id": c.upload(GOOD), "completion_window": "24h"}),
        400,
        "missing_required_parameter",
    ),
    request("batch_input_file_id_not_a_string", lambda c: c.create(input_file_id=["file-x"]), 400, "invalid_type"),
    request(
        "batch_wrong_completion_window",
        lambda c: c.create(input_file_id=c.upload(GOOD), completion_window="48h"),
        400,
        "invalid_value",
    ),
    request(
        "batch_unsupported_endpoint",
        lambda c: c.create(input_file_id=c.upload(GOOD), endpoint="/v1/moderations"),
        400,
        "invalid_value",
    ),
    request("batch_unknown_input_file", lambda c: c.create(input_file_id="file-doesnotexist"), 404),
    request("batch_input_file_path_traversal", lambda c: c.create(input_file_id=TRAVERSAL), 404),
    request("batch_input_file_sql", lambda c: c.create(input_file_id=SQL), 404),
    request("batch_input_file_deleted", lambda c: c.create(input_file_id=_deleted_file(c)), 404),
    request(
        "batch_input_file_wrong_purpose",
        lambda c: c.create(input_file_id=c.upload(GOOD, "user_data")),
        400,
        "invalid_value",
    ),
    request(  # PostgreSQL refuses a lone surrogate in a text parameter
        "batch_input_file_id_lone_surrogate",
        lambda c: c.send(
            "POST",
            "/v1/batches",
            data=b'{"input_file_id": "\\ud800", "endpoint": "/v1/chat/completions", "completion_window": "24h"}',
            headers={"Content-Type": "application/json"},
        ),
        400,
        "invalid_json",
    ),
    request(
        "metadata_lone_surrogate",
        lambda c: c.send(
            "POST",
            "/v1/batches",
            data=b'{"input_file_id": "%s", "endpoint": "/v1/chat/completions", "completion_window": "24h", '
            b'"metadata": {"k": "\\udfff"}}' % c.upload(GOOD).encode(),
            headers={"Content-Type": "application/json"},
        ),
        400,
        "invalid_json",
    ),
    request("metadata_17_pairs", metadata({f"k{i}": "v" for i in range(17)}), 400, "invalid_value"),
    request("metadata_long_key", metadata({"k" * 65: "v"}), 400, "invalid_value"),
    request("metadata_long_value", metadata({"k": "v" * 513}), 400, "invalid_value"),
    request("metadata_non_string_value", metadata({"k": 1}), 400, "invalid_type"),
    request("metadata_not_an_object", metadata(["k", "v"]), 400, "invalid_type"),
    # --- bodies bounded before they are read (64 KB for JSON routes)
    request(
        "batch_body_over_64_kb",
        lambda c: c.create(input_file_id="file-x", metadata={"k": "v" * 70_000}),
        413,
        "request_too_large",
    ),
    request(
        "batch_body_chunked_over_64_kb",
        lambda c: c.send(
            "POST", "/v1/batches", data=(b"x" * 16_384 for _ in range(8)), headers={"Content-Type": "application/json"}
        ),
        413,
        "request_too_large",
    ),
    request(
        "cancel_with_a_large_body",
        lambda c: c.send("POST", "/v1/batches/batch_x/cancel", data=b"x" * 100_000),
        413,
        "request_too_large",
    ),
    # --- idempotency keys
    request("idempotency_key_reused_on_batches", lambda c: _reused_batch_key(c), 409, "idempotency_key_reused"),
    request("idempotency_key_reused_on_files", lambda c: _reused_file_key(c), 409, "idempotency_key_reused"),
    request(
        "idempotency_key_replayed_after_its_file_was_deleted",
        lambda c: _replayed_deleted_file(c),
        409,
        "idempotency_key_file_deleted",
    ),
    request(
        "idempotency_key_too_long",
        lambda c: c.send("POST", "/v1/batches", json={}, headers={"Idempotency-Key": "k" * 256}),
        400,
        "invalid_value",
    ),
    request(
        "idempotency_key_with_a_tab",
        lambda c: c.send("POST", "/v1/batches", json={}, headers={"Idempotency-Key": "a\tb"}),
        400,
        "invalid_value",
    ),
    # --- expiration policies
    request("upload_expires_after_too_short", expires_after("created_at", "60"), 400, "invalid_value"),
    request("upload_expires_after_too_long", expires_after("created_at", "2592001"), 400, "invalid_value"),
    request("upload_expires_after_wrong_anchor", expires_after("last_active_at", "3600"), 400, "invalid_value"),
    request("upload_expires_after_not_a_number", expires_after("created_at", "soon"), 400, "invalid_type"),
    request("upload_expires_after_superscript_digit", expires_after("created_at", "\u00b2"), 400, "invalid_type"),
    request(  # Arabic-Indic 3600: int() reads it as 3600, but it is not a number in the API's sense
        "upload_expires_after_arabic_indic_digits",
        expires_after("created_at", "\u0663\u0666\u0660\u0660"),
        400,
        "invalid_type",
    ),
    request("upload_expires_after_without_anchor", expires_after(None, "3600"), 400, "missing_required_parameter"),
    request(
        "batch_output_expires_after_too_short",
        output_expires_after({"anchor": "created_at", "seconds": 59}),
        400,
        "invalid_value",
    ),
    request("batch_output_expires_after_not_an_object", output_expires_after("1h"), 400, "invalid_type"),
    request(
        "batch_output_expires_after_seconds_as_text",
        output_expires_after({"anchor": "created_at", "seconds": "3600"}),
        400,
        "invalid_type",
    ),
    request(
        "batch_output_expires_after_unknown_field",
        output_expires_after({"anchor": "created_at", "seconds": 3600, "after": 1}),
        400,
        "invalid_value",
    ),
    # --- quotas (globex's are tiny)
    request(
        "upload_over_storage_quota",
        lambda c: multipart(c.globex(), file=("a.bin", b"x" * 1_500), purpose=(None, "user_data")),
        400,
        "storage_limit_exceeded",
    ),
    request("batch_over_open_batch_quota", lambda c: _second_open_batch(c.globex()), 429, "batch_limit_exceeded"),
    request(  # outputs need room: a tenant whose files fill its stored bytes starts no batch (review H1)
        "batch_while_stored_bytes_are_full",
        lambda c: _batch_at_full_storage(c.globex()),
        400,
        "storage_limit_exceeded",
    ),
    # --- reads, cursors and ids
    request("files_limit_negative", lambda c: c.send("GET", "/v1/files", params={"limit": -1}), 400, "invalid_value"),
    request(
        "files_limit_oversized", lambda c: c.send("GET", "/v1/files", params={"limit": 10_001}), 400, "invalid_value"
    ),
    request(
        "files_limit_not_a_number", lambda c: c.send("GET", "/v1/files", params={"limit": "ten"}), 400, "invalid_type"
    ),
    request(
        "files_limit_non_ascii_digits",
        lambda c: c.send("GET", "/v1/files", params={"limit": "\u0661\u0660"}),
        400,
        "invalid_type",
    ),
    request(
        "files_order_unknown", lambda c: c.send("GET", "/v1/files", params={"order": "random"}), 400, "invalid_value"
    ),
    request("files_unknown_after", lambda c: c.send("GET", "/v1/files", params={"after": "file-nope"}), 404),
    request(
        "batches_limit_negative", lambda c: c.send("GET", "/v1/batches", params={"limit": -5}), 400, "invalid_value"
    ),
    request("batches_limit_zero", lambda c: c.send("GET", "/v1/batches", params={"limit": 0}), 400, "invalid_value"),
    request(
        "batches_limit_oversized", lambda c: c.send("GET", "/v1/batches", params={"limit": 101}), 400, "invalid_value"
    ),
    request("batches_unknown_after", lambda c: c.send("GET", "/v1/batches", params={"after": "batch_nope"}), 404),
    request("batches_after_sql", lambda c: c.send("GET", "/v1/batches", params={"after": "' OR 1=1 --"}), 404),
    request("file_id_path_traversal", lambda c: c.send("GET", "/v1/files/..%2F..%2F..%2Fetc%2Fpasswd"), 404),
    request(
        "file_content_path_traversal", lambda c: c.send("GET", "/v1/files/..%2F..%2F..%2Fetc%2Fpasswd/content"), 404
    ),
    request("file_content_blob_name", lambda c: c.send("GET", f"/v1/files/{_blob_of(c)}/content"), 404),
    request("file_id_sql", lambda c: c.send("DELETE", "/v1/files/" + requests.utils.quote(SQL, safe="")), 404),
    request("batch_id_sql", lambda c: c.send("GET", "/v1/batches/batch_x'%3B%20DROP%20TABLE%20batches%3B--"), 404),
    request("cancel_unknown_batch", lambda c: c.send("POST", "/v1/batches/batch_nope/cancel"), 404),
    request("cancel_completed_batch", cancel_of("completed"), 409, "batch_not_cancellable"),
    request("cancel_failed_batch", cancel_of("failed"), 409, "batch_not_cancellable"),
    request("cancel_expired_batch", cancel_of("expired"), 409, "batch_not_cancellable"),
    # --- routes
    request("unknown_endpoint", lambda c: c.send("GET", "/v1/responses"), 404, "unknown_url"),
    request("wrong_method_on_batches", lambda c: c.send("PUT", "/v1/batches"), 405, "method_not_allowed"),
    request("wrong_method_on_a_batch", lambda c: c.send("DELETE", "/v1/batches/batch_x"), 405, "method_not_allowed"),
    request("wrong_method_on_a_file", lambda c: c.send("PATCH", "/v1/files/file-x"), 405, "method_not_allowed"),
]


def _reused_batch_key(c: Client) -> requests.Response:
    file_id, key = c.upload(GOOD), {"Idempotency-Key": "retry-1"}
    first = c.send(
        "POST",
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
        headers=key,
    )
    assert first.status_code == 200, first.text
    c.batches.add(first.json()["id"])
    other = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", "metadata": {"run": "2"}}
    return c.send("POST", "/v1/batches", json=other, headers=key)


def _reused_file_key(c: Client) -> requests.Response:
    c.upload(GOOD, headers={"Idempotency-Key": "upload-1"})
    return c.send(
        "POST",
        "/v1/files",
        files={"file": ("in.jsonl", GOOD + GOOD)},
        data={"purpose": "batch"},
        headers={"Idempotency-Key": "upload-1"},
    )


def _replayed_deleted_file(c: Client) -> requests.Response:
    """A retry of an upload whose file the client deleted since: not that file as live, nor a second one."""
    key = {"Idempotency-Key": "upload-then-delete"}
    file_id = c.upload(GOOD, headers=key)
    assert c.send("DELETE", f"/v1/files/{file_id}").status_code == 200
    c.files.discard(file_id)
    return c.send("POST", "/v1/files", files={"file": ("in.jsonl", GOOD)}, data={"purpose": "batch"}, headers=key)


def _batch_at_full_storage(globex: Client) -> requests.Response:
    pad = b" " * (TENANT_LIMITS["globex"]["stored_bytes"] - len(GOOD))  # JSON allows the spaces: still a good file
    full = GOOD[:-1] + pad + b"\n"
    return globex.create(input_file_id=globex.upload(full))


def _second_open_batch(globex: Client) -> requests.Response:
    first = globex.batch_of(GOOD)
    assert first.status_code == 200 and first.json()["status"] == "in_progress", first.text
    return globex.create(input_file_id=globex.upload(b"\n" + GOOD))


def _deleted_file(c: Client) -> str:
    file_id = c.upload(GOOD)
    assert c.send("DELETE", f"/v1/files/{file_id}").status_code == 200
    c.files.discard(file_id)
    return file_id


def _blob_of(c: Client) -> str:
    """The on-disk name of a live file: not an id, so it must answer 404 like any unknown one."""
    c.upload(GOOD)
    (blob,) = c.rt.blobs.root.iterdir()
    return blob.name


def test_corpus_is_large_and_names_are_unique():
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input(case: Case, live_api, rt):
    c = Client(live_api.url, rt)
    files_before, batches_before = c.visible()
    assert not files_before and not batches_before

    r = case.call(c)

    assert r.status_code == case.status, r.text[:500]
    body = r.json()
    if case.status != 200:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["code"] == case.code, body
        assert body["error"]["type"] == "invalid_request_error", body
    elif case.kind == "ingest":
        assert body["status"] == "failed", body
        assert body["errors"]["data"][0]["code"] == case.code, body["errors"]
        assert body["failed_at"] and body["request_counts"]["total"] == 0
    else:
        assert body["status"] == "in_progress" and body["request_counts"]["total"] == 2, body

    files_after, batches_after = c.visible()
    assert files_after == c.files, "an upload became visible that the case did not mean to store"
    assert batches_after == c.batches, "a batch became visible that the case did not mean to create"
    with rt.store.read() as s:
        if case.kind != "request":  # a failed batch holds no item and queued nothing; an accepted one all of them
            items = s.scalar(select(func.count()).select_from(Item).where(Item.batch_id == body["id"]))
            assert items == (0 if case.kind == "ingest" else 2)
            if case.kind == "ingest":
                assert rt.redis.zcard(keys.ready(body["id"])) == 0
        live_blobs = {f.blob for f in s.scalars(select(File).where(File.deleted.is_(False)))}
    on_disk = {p.name for p in rt.blobs.root.iterdir()}
    assert on_disk == live_blobs, "a stray or partial blob was left in the blob directory"
