"""The events of an OpenAI-protocol stream, as vLLM sends them: ``data: <json>`` lines ended by ``\\n``.

httpx's ``aiter_lines`` splits as ``str.splitlines`` does, also at U+2028, U+0085 and the other Unicode line
separators, which a random-weight model's text carries raw inside the JSON (only ASCII controls are escaped):
such an event arrived cut in two and its JSON did not parse. Lines are split at ``\\n`` alone here.
"""

from __future__ import annotations

import json
import typing as t

import httpx


async def events(resp: httpx.Response) -> t.AsyncIterator[dict[str, t.Any]]:
    """Each ``data:`` event of ``resp``'s body, parsed, up to ``[DONE]``."""
    pending = b""
    async for chunk in resp.aiter_bytes():
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].rstrip(b"\r")
            if data == b"[DONE]":
                return
            yield json.loads(data)
