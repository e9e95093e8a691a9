"""The harvest benchmark's online client, run as its own process: open loop, timed from each scheduled arrival.

``python -m tidal_workers.bench.client SPEC OUT`` reads the phase's requests (arrival offsets, prompts, output
lengths) and the monotonic instant the phase opens, sends each streaming request at priority 0 at its arrival
whatever the earlier ones did, and writes one record per request. Latencies are measured from the scheduled
arrival, not from when the request was sent, so a client that falls behind shows up as latency (no coordinated
omission), and how late each request was sent is recorded beside it. Being a process of its own, it does not
share an interpreter with the benchmark's samplers and Tidal's in-process API.

Tokens are counted from the usage the engine reports on every chunk (``continuous_usage_stats``): a
random-weight model's tokens often decode to no text, so a chunk may stand for several tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import httpx

from tidal_workers.bench import sse


@dataclasses.dataclass
class Record:
    at: float  # scheduled arrival, seconds after the phase opened
    late: float = 0.0  # seconds between the scheduled arrival and the send
    chunks: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (s after arrival, tokens so far)
    prompt_tokens: int = 0
    error: str | None = None


def body(model: str, prompt: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "priority": 0,
        "messages": [{"role": "user", "content": prompt}],
    }


async def _one(client: httpx.AsyncClient, url: str, payload: dict, record: Record, due: float) -> None:
    record.late = time.monotonic() - due
    try:
        async with client.stream("POST", url, json=payload) as resp:
            if resp.status_code != 200:
                record.error = f"http {resp.status_code}"
                return
            async for event in sse.events(resp):
                usage = event.get("usage") or {}
                tokens = usage.get("completion_tokens", 0)
                record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
                if tokens > (record.chunks[-1][1] if record.chunks else 0):
                    record.chunks.append((round(time.monotonic() - due, 5), tokens))
    except (httpx.HTTPError, ValueError) as exc:  # a bad event is this request's error, not the phase's end
        record.error = type(exc).__name__


async def run(spec: dict, opens: float) -> list[Record]:
    """Send every request of ``spec`` at ``opens`` (a time.monotonic() instant: CLOCK_MONOTONIC is the same in
    every process of the machine) plus its arrival offset."""
    url = f"{spec['url']}/v1/chat/completions"
    records = [Record(at=r["at"]) for r in spec["requests"]]
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        tasks = []
        for r, record in zip(spec["requests"], records):
            due = opens + r["at"]
            if (delay := due - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            payload = body(spec["model"], r["prompt"], r["max_tokens"])
            tasks.append(asyncio.create_task(_one(client, url, payload, record, due)))
        await asyncio.gather(*tasks)
    return records


LEAD_S = 0.5  # between the client saying it is ready and its first arrival


class OnlineClient:
    """This module run as a process by a benchmark: started, told when to open, waited for."""

    def __init__(self, tmp: Path, url: str, model: str, requests: t.Sequence[t.Any]) -> None:
        self.spec = tmp / "spec.json"
        self.out = tmp / "records.json"
        wire = [dataclasses.asdict(r) for r in requests]
        self.spec.write_text(json.dumps({"url": url, "model": model, "requests": wire}))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidal_workers.bench.client", str(self.spec), str(self.out)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ready(self) -> None:
        """Block until the process has imported everything and read its spec."""
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"online client failed to start ({self.process.wait()})")

    def start(self, opens: float) -> None:
        """Tell it the monotonic instant its first arrival counts from (several clients can share one)."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{opens}\n")
        self.process.stdin.flush()

    def open(self) -> float:
        """Ready, then opened ``LEAD_S`` from now; returns the instant."""
        self.ready()
        opens = time.monotonic() + LEAD_S
        self.start(opens)
        return opens

    def wait(self, timeout: float) -> list[dict]:
        if self.process.wait(timeout) != 0:
            raise RuntimeError(f"online client exited with {self.process.returncode}")
        return json.loads(self.out.read_text())


def main(argv: list[str]) -> None:
    spec_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())
    print("ready", flush=True)  # imports done and spec read: the parent now names the instant the phase opens
    opens = float(sys.stdin.readline())
    records = asyncio.run(run(spec, opens))
    Path(out_path).write_text(json.dumps([dataclasses.asdict(r) for r in records]))


if __name__ == "__main__":
    main(sys.argv[1:])
