"""The batch input validator, line by line, on real files."""

from __future__ import annotations

import json
import typing

import pytest

from config import load_settings
from tidal_workers import validate
from tidal_workers.validate import validate_file

CHAT = "/v1/chat/completions"
SETTINGS = load_settings(models="", max_file_lines=50_000)


def line(custom_id="1", *, model="m", url=CHAT, method="POST", **body):
    return {
        "custom_id": custom_id,
        "method": method,
        "url": url,
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], **body},
    }


def run(tmp_path, lines, *, endpoint=CHAT, settings=SETTINGS, raw: bytes | None = None):
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        raw
        if raw is not None
        else b"".join((x if isinstance(x, str) else json.dumps(x)).encode() + b"\n" for x in lines)
    )
    accepted = []
    with open(path, "rb") as f:
        result = validate_file(f, endpoint, settings, accepted.append)
    assert result.accepted == len(accepted)
    return Run(result, accepted)


class Run(typing.NamedTuple):
    result: validate.Validation
    items: list[validate.ParsedLine]  # what the callback received, in order

    def __getattr__(self, name):  # the Validation's fields: r.errors, r.error_count, r.model
        return getattr(self.result, name)


def codes(result):
    return [(e.code, e.line, e.param) for e in result.errors]


def test_valid_file(tmp_path):
    r = run(tmp_path, [line("a"), line("b", temperature=0)])
    assert r.error_count == 0 and r.errors == [] and r.model == "m"
    assert [(p.line, p.custom_id, p.url, p.model) for p in r.items] == [(1, "a", CHAT, "m"), (2, "b", CHAT, "m")]
    assert json.loads(r.items[1].body) == line("b", temperature=0)["body"]


@pytest.mark.parametrize(
    "bad,expected",
    [
        ("{oops", ("invalid_json_line", 1, None)),
        ("[1, 2]", ("invalid_json_line", 1, None)),
        (
            '{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "n": NaN}}',
            ("invalid_json_line", 1, None),
        ),
        ("[" * 100_000, ("invalid_json_line", 1, None)),
        ({"method": "POST", "url": CHAT, "body": {"model": "m"}}, ("missing_required_parameter", 1, "custom_id")),
        ({"custom_id": "1", "url": CHAT, "body": {"model": "m"}}, ("missing_required_parameter", 1, "method")),
        ({"custom_id": "1", "method": "POST", "body": {"model": "m"}}, ("missing_required_parameter", 1, "url")),
        ({"custom_id": "1", "method": "POST", "url": CHAT}, ("missing_required_parameter", 1, "body")),
        (line(method="GET"), ("invalid_request", 1, "method")),
        (line(url="/v1/embeddings"), ("invalid_url", 1, "url")),
        (line(stream=True), ("streaming_unsupported", 1, "body.stream")),
        (line(model=None), ("invalid_request", 1, "body.model")),
        (line(model=7), ("invalid_request", 1, "body.model")),
        (line(model="x" * 257), ("invalid_request", 1, "body.model")),
        (line(custom_id=5), ("invalid_request", 1, "custom_id")),
        (line(custom_id="x" * 513), ("invalid_request", 1, "custom_id")),
        (line(custom_id="a\x00b"), ("invalid_request", 1, "custom_id")),
        (line(custom_id="\ud800"), ("invalid_request", 1, "custom_id")),
        ({**line(), "body": "text"}, ("invalid_request", 1, "body")),
    ],
)
def test_line_errors(tmp_path, bad, expected):
    assert codes(run(tmp_path, [bad])) == [expected]


def test_stream_false_is_fine(tmp_path):
    assert run(tmp_path, [line(stream=False)]).error_count == 0


def test_duplicates_models_and_model_list(tmp_path):
    r = run(tmp_path, [line("a"), line("a"), line("b", model="other")])
    assert codes(r) == [("duplicate_custom_id", 2, "custom_id"), ("mismatched_model", 3, "body.model")]
    listed = load_settings(models="m, n")
    assert codes(run(tmp_path, [line("a", model="z")], settings=listed)) == [("model_not_found", 1, "body.model")]
    assert run(tmp_path, [line("a", model="n")], settings=listed).error_count == 0


def test_blank_lines_bom_and_no_final_newline(tmp_path):
    body = json.dumps(line("a")).encode()
    r = run(tmp_path, [], raw=b"\xef\xbb\xbf" + body + b"\n\n  \r\n" + json.dumps(line("b")).encode())
    assert r.error_count == 0 and [(p.line, p.custom_id) for p in r.items] == [(1, "a"), (4, "b")]


def test_file_level_errors(tmp_path):
    assert codes(run(tmp_path, [], raw=b"")) == [("empty_file", None, None)]
    assert codes(run(tmp_path, [], raw=b"\n \n")) == [("empty_file", None, None)]
    utf16 = (json.dumps(line("a")) + "\n").encode("utf-16")
    assert codes(run(tmp_path, [], raw=utf16))[0][0] == "invalid_encoding"
    latin1 = json.dumps(line("a")).encode() + b"\n" + '{"x": "caf\xe9"}'.encode("latin-1") + b"\n"
    assert codes(run(tmp_path, [], raw=latin1)) == [("invalid_encoding", 2, None)]
    few = load_settings(max_file_lines=2)
    assert codes(run(tmp_path, [line("a"), "", line("b"), line("c")], settings=few)) == [("too_many_lines", 4, None)]


def test_errors_are_capped_but_counted(tmp_path):
    r = run(tmp_path, ["nope"] * (validate.MAX_REPORTED_ERRORS + 5))
    assert len(r.errors) == validate.MAX_REPORTED_ERRORS and r.error_count == validate.MAX_REPORTED_ERRORS + 5
    assert r.error_count > 0


def test_prefix_key_reads_every_endpoint_shape():
    assert (
        validate.prefix_key(
            {
                "messages": [
                    {"role": "system", "content": "ab"},
                    {"role": "user", "content": [{"type": "text", "text": "cd"}]},
                ]
            }
        )
        == "abcd"
    )
    assert validate.prefix_key({"prompt": "hello"}) == "hello"
    assert validate.prefix_key({"prompt": ["one", "two"]}) == "onetwo"
    assert validate.prefix_key({"input": "embed me"}) == "embed me"
    assert validate.prefix_key({"prompt": [1, 2, 3]}) == "1 2 3 "
    assert validate.prefix_key({"prompt": "x" * 5000}) == "x" * validate.PREFIX_CHARS
    assert validate.prefix_key({"messages": "not a list", "prompt": None}) == ""


def test_other_endpoints(tmp_path):
    emb = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "x"}}
    assert run(tmp_path, [emb], endpoint="/v1/embeddings").items[0].prefix_key == "x"


def test_a_line_past_the_limit_is_an_error_and_is_skipped_unread(tmp_path):
    """A file that is one huge line must not become one huge string (ingest's memory bound)."""
    small = load_settings(max_line_bytes=1024)
    long = line("b", messages=[{"role": "user", "content": "x" * 5000}])
    r = run(tmp_path, [line("a"), long, line("c")], settings=small)
    assert codes(r) == [("line_too_large", 2, None)] and [p.custom_id for p in r.items] == ["a", "c"]
    d, e = (
        json.dumps(line("d", messages=[{"role": "user", "content": "x" * 1100}])).encode(),
        json.dumps(line("e")).encode(),
    )
    at_limit = load_settings(max_line_bytes=len(d))  # the limit counts the line's bytes, not its newline
    assert run(tmp_path, [], raw=d + b"\n" + e, settings=at_limit).error_count == 0
    assert codes(run(tmp_path, [], raw=d + b" ", settings=at_limit)) == [("line_too_large", 1, None)]
