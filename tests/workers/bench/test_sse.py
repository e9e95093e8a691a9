"""The stream reader of the benchmarks' online clients splits events at "\n" only (tidal_workers/bench/sse.py)."""

from __future__ import annotations

import asyncio
import json

import httpx

from tidal_workers.bench import sse


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk


def read(chunks: list[bytes]) -> list[dict]:
    async def collect() -> list[dict]:
        return [event async for event in sse.events(httpx.Response(200, stream=Chunks(chunks)))]

    return asyncio.run(collect())


def test_text_holding_unicode_line_separators_stays_one_event():
    # vLLM writes non-ASCII characters raw: a random model's U+2028 or U+0085 sits inside the JSON string.
    first = {"choices": [{"delta": {"content": "a\u2028b\x85c\u2029"}}], "usage": {"completion_tokens": 1}}
    second = {"choices": [], "usage": {"completion_tokens": 2}}
    body = b"".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n".encode() for e in (first, second))
    body += b"data: [DONE]\n\n"
    # Cut the body into 7-byte chunks: lines and multi-byte characters straddle the chunks.
    assert read([body[i : i + 7] for i in range(0, len(body), 7)]) == [first, second]


def test_nothing_after_done_and_no_non_data_lines():
    body = b': keep-alive\r\n\r\ndata: {"n": 1}\r\n\r\ndata: [DONE]\n\ndata: {"n": 2}\n\n'
    assert read([body]) == [{"n": 1}]
