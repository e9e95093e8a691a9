"""The harvest benchmark's online client, run as its own process: open loop, timed from each scheduled arrival.

``python -m tidal_workers.bench.client SPEC OUT`` reads the phase's requests (arrival offsets, prompts, output
lengths) and the monotonic instant the phase opens, sends each streaming request at priority 0 at its arrival
whatever the earlier ones did, and writes one record per request.

A spec may also hold a lead-in (``lead_in``: requests of the same form): the first instant read opens the lead-in,
and the second, told whenever the benchmark decides (the frontier's window opens once the batch has settled),
opens the measured requests; lead-in arrivals due from then on are not sent. A third, if told, closes the
measured requests: those due from then on are not sent (the frontier's window ends before its trace does). The
lead-in's records go to OUT.lead_in. So the online load is present from the start, and every arm measures the same trace. Latencies are measured from the scheduled
arrival, not from when the request was sent, so a client that falls behind shows up as latency (no coordinated
omission), and how late each request was sent is recorded beside it. Being a process of its own, it does not
share an interpreter with the benchmark's samplers and Tidal's in-process API.

Tokens are counted from the usage the engine reports on every chunk (``continuous_usage_stats``): a
random-weight model's tokens often decode to no text, so a chunk may stand for several tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import subprocess
import sys
import threading
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


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=600.0, limits=httpx.Limits(max_connections=2048, max_keepalive_connections=256))


async def _send(
    client: httpx.AsyncClient,
    spec: dict,
    requests: list[dict],
    opens: float,
    until: asyncio.Future[float] | None = None,
) -> tuple[list[Record], list[asyncio.Task]]:
    """Start each request at ``opens`` plus its arrival offset; with ``until``, stop at the first one due at or
    after the instant it resolves to. Returns the records of the requests sent and their tasks."""
    url = f"{spec['url']}/v1/chat/completions"
    records, tasks = [], []
    for r in requests:
        due = opens + r["at"]
        while until is not None and not until.done() and (delay := due - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(until), delay)
        if until is not None and until.done() and due >= until.result():
            break
        if (delay := due - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        record = Record(at=r["at"])
        payload = body(spec["model"], r["prompt"], r["max_tokens"])
        records.append(record)
        tasks.append(asyncio.create_task(_one(client, url, payload, record, due)))
    return records, tasks


async def run(spec: dict, opens: float) -> list[Record]:
    """Send every request of ``spec`` at ``opens`` (a time.monotonic() instant: CLOCK_MONOTONIC is the same in
    every process of the machine) plus its arrival offset."""
    async with _client() as client:
        records, tasks = await _send(client, spec, spec["requests"], opens)
        await asyncio.gather(*tasks)
    return records


async def run_with_lead_in(spec: dict, lead_opens: float, instant: t.Callable[[], float]) -> tuple[list, list]:
    """The lead-in from ``lead_opens`` until the instant ``instant`` returns (it blocks: read in a thread), then
    the measured requests from that instant until the next instant it returns (inf: to their end). Returns
    (lead-in records, measured records)."""
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[float] = loop.create_future()
    closed: asyncio.Future[float] = loop.create_future()

    def read() -> None:
        for future in (opened, closed):
            loop.call_soon_threadsafe(future.set_result, instant())

    threading.Thread(target=read, daemon=True).start()
    async with _client() as client:
        lead, lead_tasks = await _send(client, spec, spec["lead_in"], lead_opens, until=opened)
        records, tasks = await _send(client, spec, spec["requests"], await opened, until=closed)
        await asyncio.gather(*lead_tasks, *tasks)
    return lead, records


LEAD_S = 0.5  # between the client saying it is ready and its first arrival


class OnlineClient:
    """This module run as a process by a benchmark: started, told when to open, waited for."""

    def __init__(
        self, tmp: Path, url: str, model: str, requests: t.Sequence[t.Any], lead_in: t.Sequence[t.Any] = ()
    ) -> None:
        self.spec = tmp / "spec.json"
        self.out = tmp / "records.json"
        spec = {"url": url, "model": model, "requests": [dataclasses.asdict(r) for r in requests]}
        if lead_in:
            spec["lead_in"] = [dataclasses.asdict(r) for r in lead_in]
        self.spec.write_text(json.dumps(spec))
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
        """Tell it the monotonic instant its first arrival counts from (several clients can share one). With a
        lead-in: the first call opens the lead-in, the second the measured requests, a third closes them."""
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
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # a phase not closed runs to the end of its requests
        if self.process.wait(timeout) != 0:
            raise RuntimeError(f"online client exited with {self.process.returncode}")
        return json.loads(self.out.read_text())

    def lead_in_records(self) -> list[dict]:
        """The lead-in's records (after ``wait``)."""
        return json.loads(lead_in_path(self.out).read_text())

    def kill(self) -> None:
        """Stop it without its records (a phase given up)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _next_instant() -> float:
    """The next instant the parent names; inf once it has closed our stdin (nothing more will come)."""
    line = sys.stdin.readline()
    return float(line) if line.strip() else math.inf


def lead_in_path(out: Path) -> Path:
    return out.with_name(out.name + ".lead_in")


def main(argv: list[str]) -> None:
    spec_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())
    print("ready", flush=True)  # imports done and spec read: the parent now names the instant the phase opens
    opens = float(sys.stdin.readline())
    if spec.get("lead_in"):
        lead, records = asyncio.run(run_with_lead_in(spec, opens, _next_instant))
        lead_in_path(Path(out_path)).write_text(json.dumps([dataclasses.asdict(r) for r in lead]))
    else:
        records = asyncio.run(run(spec, opens))
    Path(out_path).write_text(json.dumps([dataclasses.asdict(r) for r in records]))


if __name__ == "__main__":
    main(sys.argv[1:])
