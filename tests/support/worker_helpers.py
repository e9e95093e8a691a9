"""Helpers of the worker tests (and of every test that runs a batch): reading batches and their output files, the
environment and start of a `tidal` child process, and of a fleet of them."""

from __future__ import annotations

import base64
import dataclasses
import errno
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests
from sqlalchemy import select

from config.settings import env_name
from tests.support.wait import wait_for
from tidal_workers import keys
from tidal_workers.engine_health import EngineHealth
from tidal_workers.leases import LeaseBook
from tidal_workers.store.models import Batch
from tidal_workers.store.models import File
from tidal_workers.store.models import Item

ROOT = Path(__file__).resolve().parents[2]

#: The worker tests' settings: short leases, retries and windows, so faults and recovery show up in seconds (over the
#: stub engine in tests/workers, a real one in tests/e2e). The gate is fixed: the AIMD gate has its own tests; here
#: the target is max_inflight.
QUICK = {
    "gate_mode": "fixed",
    "lease_seconds": 1.5,
    "claim_idle_seconds": 0.02,
    "retry_backoff_seconds": 0.02,
    "retry_budget": 3,
    "request_timeout_seconds": 1.0,
    "max_inflight": 4,
    "worker_threads": 4,
    "reclaim_seconds": 0.5,
    "beat_lock_seconds": 2,
}


def redis_now(rt) -> float:
    """Redis's clock, which lease expiries are stamped with."""
    seconds, micros = rt.redis.time()
    return seconds + micros / 1e6


def wait_lease_expired(rt, item_id: int, timeout: float = 30.0) -> None:
    """Until Redis's clock passes the item's lease expiry (the event a reclaim sweep acts on)."""
    expiry = rt.redis.zscore(keys.INFLIGHT, str(item_id))
    assert expiry is not None, f"item {item_id} holds no lease"
    wait_for(lambda: redis_now(rt) > expiry, timeout, what=f"item {item_id}'s lease to expire")


def batch_row(rt, batch_id: str) -> Batch:
    with rt.store.read() as s:
        return s.get(Batch, batch_id)


def queued(rt, batch_id: str) -> int:
    """Items of ``batch_id`` waiting in its Redis ready set (what a claim can still pop)."""
    return int(rt.redis.zcard(keys.ready(batch_id)))


def item_ids(rt, batch_id: str) -> list[int]:
    with rt.store.read() as s:
        return list(s.scalars(select(Item.id).where(Item.batch_id == batch_id).order_by(Item.line)))


def file_lines(rt, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    with rt.store.read() as s:
        f = s.get(File, file_id)
        assert f.purpose == "batch_output"
        raw = rt.blobs.read_bytes(f.blob)
    lines = [json.loads(x) for x in raw.decode().splitlines()]
    assert len(lines) == f.lines and len(raw) == f.bytes
    return lines


def settled(rt, batch_id: str, statuses=("completed",), timeout: float = 30.0):
    """Wait until the batch reaches one of ``statuses``; return (batch, output lines, error lines)."""
    wait_for(lambda: batch_row(rt, batch_id).status in statuses, timeout, what=f"{batch_id} to reach {statuses}")
    b = batch_row(rt, batch_id)
    return b, file_lines(rt, b.output_file_id), file_lines(rt, b.error_file_id)


def assert_exactly_once(rt, batch_id: str, out: list[dict], err: list[dict]) -> None:
    ids = [line["custom_id"] for line in out + err]
    with rt.store.read() as s:
        expected = set(s.scalars(select(Item.custom_id).where(Item.batch_id == batch_id)))
    assert len(ids) == len(set(ids)), "a custom_id appears twice"
    assert set(ids) == expected, "a custom_id is missing"


def settings_env(settings) -> dict[str, str]:
    """The TIDAL_* environment that makes a child process load exactly ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_")}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        env[env_name(f.name)] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONPATH"] = str(ROOT)
    return env


def on_stub(settings, stub, **changes):
    """``settings`` for `tidal` processes on the stub engine, with ``changes``: a fixed gate (its target is
    max_inflight) and no worker /metrics port, which the processes of one test would share."""
    return settings.replace(vllm_url=stub.url, gate_mode="fixed", worker_metrics_port=0, **changes)


def spawn(settings, *args: str, log: Path) -> subprocess.Popen:
    """Start ``tidal <args>`` as a child process with ``settings``; output goes to ``log``."""
    out = open(log, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "tidal_api.cli", *args],
        cwd=ROOT,
        env=settings_env(settings),
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def spawn_fleet(settings, engines: dict[str, str], children: list[subprocess.Popen], log_dir: Path) -> None:
    """A fleet as deployed: a GPU node's `tidal worker` per node in ``engines`` (node: its engine's URL), then the
    ops worker, which finalizes; each appended to ``children``, its log ``log_dir/<node>.log`` (``ops.log``)."""
    for node, url in engines.items():
        worker = settings.replace(node=node, vllm_url=url)
        children.append(spawn(worker, "worker", "--loglevel=warning", log=log_dir / f"{node}.log"))
    children.append(spawn(settings, "worker", "--ops", "--loglevel=warning", log=log_dir / "ops.log"))


def validating_batch(rt, data: bytes, endpoint: str = "/v1/chat/completions", tenant: str = "acme") -> str:
    """A tenant's batch over a stored input file, still `validating`, as POST /v1/batches leaves it before ingest."""
    return validating_stored_batch(rt, rt.blobs.write_stream(io.BytesIO(data)), endpoint, tenant)


def validating_stored_batch(rt, written, endpoint: str = "/v1/chat/completions", tenant: str = "acme") -> str:
    """``validating_batch`` over a blob already written (``Written``: name, bytes, lines)."""
    now = int(time.time())
    with rt.store.transaction() as s:
        f = File(
            tenant_id=tenant,
            filename="in.jsonl",
            purpose="batch",
            bytes=written.bytes,
            lines=written.lines,
            created_at=now,
            blob=written.name,
        )
        s.add(f)
        s.flush()
        b = Batch(tenant_id=tenant, endpoint=endpoint, input_file_id=f.id, created_at=now, expires_at=now + 86400)
        s.add(b)
    return b.id


CHAT = "/v1/chat/completions"


def open_for_writing(fifo: Path) -> int | None:
    """The write end of a named pipe once a reader has it open (or is blocked opening it), else None."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet
            return None
        raise


def upload_batch(
    api: str,
    n: int,
    model: str = "m",
    key: str = "acme-key",
    max_tokens: int | None = None,
    tag: str = "r",
    ignore_eos: bool = False,
) -> str:
    """Create a batch of ``n`` chat requests through the API (content = custom_id); returns its id.

    ``ignore_eos`` makes a real engine generate exactly ``max_tokens``, so a request's length is known.
    """
    lines = []
    for i in range(n):
        body = {"model": model, "messages": [{"role": "user", "content": f"{tag}-{i}"}]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if ignore_eos:
            body["ignore_eos"] = True
        lines.append(
            json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": CHAT, "body": body}).encode() + b"\n"
        )
    auth = {"Authorization": f"Bearer {key}"}
    r = requests.post(
        api + "/v1/files",
        headers=auth,
        files={"file": ("in.jsonl", b"".join(lines))},
        data={"purpose": "batch"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = requests.post(
        api + "/v1/batches",
        headers=auth,
        timeout=60,
        json={"input_file_id": r.json()["id"], "endpoint": CHAT, "completion_window": "24h"},
    )
    assert r.status_code == 200, r.text
    return r.json()["id"]


def on_node(rt, n: int = 1):
    """n claims of this node, booked as the claim loop books them, an open gate, and the node's EngineHealth."""
    claims = rt.queue.claim(rt.settings.node, n, lease_seconds=30, models=("m",))
    book = LeaseBook()
    book.set_target(n)
    for c in claims:
        book.add(c.attempt)
    return claims, book, EngineHealth(rt, book)


def booked(claim) -> LeaseBook:
    """The node's book holding only ``claim``, with one engine token: as the claim loop leaves it."""
    book = LeaseBook()
    book.add(claim.attempt)
    book.set_target(1)
    return book


def ops_batch_ids(rt, task: str, queue: str = "tidal.ops") -> list[str]:
    """The batch ids (first argument) of the ``task`` messages waiting in an ops queue, taken out of it."""
    ids = []
    while (raw := rt.redis.rpop(queue)) is not None:
        message = json.loads(raw)
        if message["headers"]["task"] == task:
            ids.append(json.loads(base64.b64decode(message["body"]))[0][0])
    return ids


def held_from(rt, stub, node: str) -> bool:
    """Whether the stub holds, unanswered, a request of an item leased to ``node``."""
    leased = {int(i) for i in rt.redis.zrange(keys.node_inflight(node), 0, -1)}
    with rt.store.read() as s:
        return any(s.scalars(select(Item.id).where(Item.id.in_(leased), Item.custom_id.in_(stub.held()))))
