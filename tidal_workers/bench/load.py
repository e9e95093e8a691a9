"""API load on loopback: batch-status polling at a fixed rate while uploads and batch creations run beside it.

Polls are open-loop: request ``i`` is due at ``start + i / rate`` whatever the
earlier ones did, so a slow server shows up as latency and a lower achieved rate
rather than being hidden by a client that waits. Latency is timed from the
moment a request is sent. Each poller thread keeps one keep-alive connection,
as a client SDK would. With no URL, a private `tidal serve` (gunicorn, SQLite
in a temp TIDAL_HOME, its own Redis DB) is started and stopped here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import typing as t
import urllib.parse
from pathlib import Path

import redis
import requests

from config.settings import child_environ
from tidal_workers.bench.stats import percentile

LOAD_REDIS_DB = 12  # the private server's queue; flushed when it stops
CHAT = "/v1/chat/completions"


@dataclasses.dataclass(frozen=True)
class LoadConfig:
    url: str
    key: str
    duration: float = 60.0
    rate: float = 200.0  # GET /v1/batches/{id} per second
    uploads: int = 2  # concurrent uploaders, each: upload a file, create a batch from it, once a second
    upload_lines: int = 200  # requests per uploaded file
    pollers: int = 16  # threads (and keep-alive connections) sharing the polling schedule
    metrics_url: str = ""  # the API's metrics listener (TIDAL_METRICS_BIND); empty: no server-side buckets


@dataclasses.dataclass
class Kind:
    """Samples of one request kind."""

    latencies: list[float] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)

    def summary(self, duration: float) -> dict:
        return {
            "requests": len(self.latencies) + len(self.errors),
            "errors": len(self.errors),
            "rate_per_s": round(len(self.latencies) / duration, 1),
            "p50_ms": _ms(percentile(self.latencies, 0.5)),
            "p99_ms": _ms(percentile(self.latencies, 0.99)),
            "max_ms": _ms(max(self.latencies, default=None)),
            "first_errors": self.errors[:5],
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def batch_input(lines: int, tag: str) -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"{tag}-{i}",
                "method": "POST",
                "url": CHAT,
                "body": {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"Say something about the number {i}."}],
                    "max_tokens": 16,
                },
            }
        ).encode()
        + b"\n"
        for i in range(lines)
    )


class _Client:
    def __init__(self, cfg: LoadConfig):
        self.cfg = cfg
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {cfg.key}"

    def upload_and_create(self, tag: str) -> tuple[tuple[float, int, str], tuple[float, int, str]]:
        """One upload and one batch creation: ((seconds, status, body) of each)."""
        t0 = time.perf_counter()
        up = self.session.post(
            self.cfg.url + "/v1/files",
            data={"purpose": "batch"},
            files={"file": (f"{tag}.jsonl", batch_input(self.cfg.upload_lines, tag))},
            timeout=60,
        )
        t1 = time.perf_counter()
        if up.status_code != 200:
            return (t1 - t0, up.status_code, up.text[:200]), (0.0, 0, "not created: upload failed")
        created = self.session.post(
            self.cfg.url + "/v1/batches",
            timeout=60,
            json={"input_file_id": up.json()["id"], "endpoint": CHAT, "completion_window": "24h"},
        )
        t2 = time.perf_counter()
        return (t1 - t0, 200, ""), (t2 - t1, created.status_code, created.text[:200])


def _record(kind: Kind, lock: threading.Lock, seconds: float, status: int, detail: str) -> None:
    with lock:
        if status == 200:
            kind.latencies.append(seconds)
        else:
            kind.errors.append(f"{status}: {detail}")


def run_load(cfg: LoadConfig) -> dict:
    """Drive the API for ``cfg.duration`` seconds; per-kind counts, errors and p50/p99 in milliseconds."""
    client = _Client(cfg)
    (_, status, detail), (_, status2, detail2) = client.upload_and_create("seed")
    if status != 200 or status2 != 200:
        raise RuntimeError(f"could not create the batch to poll: {status} {detail} {status2} {detail2}")
    batch_id = client.session.get(cfg.url + "/v1/batches", params={"limit": 1}, timeout=10).json()["data"][0]["id"]

    kinds = {"get_batch": Kind(), "upload_file": Kind(), "create_batch": Kind()}
    lock = threading.Lock()
    start = time.perf_counter() + 0.5  # threads connect first
    end = start + cfg.duration
    total = int(cfg.duration * cfg.rate)
    next_index = iter(range(total))
    target = urllib.parse.urlsplit(cfg.url)
    path = f"/v1/batches/{batch_id}"
    headers = {"Authorization": f"Bearer {cfg.key}"}

    def poller() -> None:
        conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=30)
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                break
            delay = start + i / cfg.rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            t0 = time.perf_counter()
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                body = response.read()
                status, detail = response.status, body[:200].decode(errors="replace")
            except (OSError, http.client.HTTPException) as exc:
                conn.close()  # reconnects on the next request
                status, detail = 0, repr(exc)
            _record(kinds["get_batch"], lock, time.perf_counter() - t0, status, detail)
        conn.close()

    def uploader(n: int) -> None:
        own = _Client(cfg)
        k = 0
        while (due := start + k) < end:  # one upload + create per second per uploader
            if (delay := due - time.perf_counter()) > 0:
                time.sleep(delay)
            try:
                upload, create = own.upload_and_create(f"u{n}-{k}")
            except requests.RequestException as exc:
                upload, create = (0.0, 0, repr(exc)), (0.0, 0, "not created: upload failed")
            _record(kinds["upload_file"], lock, *upload)
            _record(kinds["create_batch"], lock, *create)
            k += 1

    load_before = os.getloadavg()[0]  # other work on the machine shows up in the tail: say how much there was
    threads = [threading.Thread(target=poller, daemon=True) for _ in range(cfg.pollers)]
    threads += [threading.Thread(target=uploader, args=(n,), daemon=True) for n in range(cfg.uploads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(cfg.duration + 120)
    elapsed = max(time.perf_counter() - start, 1e-9)
    summary = {name: kind.summary(elapsed) for name, kind in kinds.items()}
    return {
        "params": dataclasses.asdict(cfg) | {"key": "***"},
        "elapsed_s": round(elapsed, 1),
        "loadavg_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "errors": sum(s["errors"] for s in summary.values()),
        "kinds": summary,
        "server_get_batch_within": _server_buckets(cfg.metrics_url) if cfg.metrics_url else None,
    }


def _server_buckets(metrics_url: str) -> dict[str, float] | None:
    """Share of GET /v1/batches/{id} answered within each bucket, timed inside the app (the API's /metrics).

    Set beside the client-side percentiles it says how much of the tail is the
    app's own work and how much is waiting: for a CPU, in a socket, in the client.
    """
    from prometheus_client.parser import text_string_to_metric_families

    with contextlib.suppress(requests.RequestException):
        text = requests.get(metrics_url + "/metrics", timeout=10).text
        buckets = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if (
                    sample.name == "tidal_api_request_seconds_bucket"
                    and labels.get("method") == "GET"
                    and labels.get("route") == "/v1/batches/<path:batch_id>"
                    and labels.get("status") == "200"
                ):
                    buckets[labels["le"]] = sample.value
        if buckets.get("+Inf"):
            return {
                f"{float(le) * 1000:g}ms" if le != "+Inf" else "all": round(100 * n / buckets["+Inf"], 2)
                for le, n in buckets.items()
            }
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served_api(
    redis_url: str, workers: int = 2, threads: int | None = None, log_dir: Path | None = None
) -> t.Iterator[tuple[str, str, str]]:
    """A private `tidal serve` on loopback ports: yields (url, key, metrics url); stopped, and its Redis DB flushed,
    on exit."""
    key = "load-" + secrets.token_hex(16)
    port, metrics_port = _free_port(), _free_port()
    queue_url = redis_url.rsplit("/", 1)[0] + f"/{LOAD_REDIS_DB}"
    with tempfile.TemporaryDirectory(prefix="tidal-load-") as home:
        env = {
            "TIDAL_HOME": home,
            "TIDAL_DATABASE_URL": "",
            "TIDAL_BLOB_DIR": "",
            "TIDAL_REDIS_URL": queue_url,
            "TIDAL_BROKER_URL": "",
            "TIDAL_ENV": "prod",
            "TIDAL_API_KEYS": f"load:{key}",
            "TIDAL_BIND": f"127.0.0.1:{port}",
            "TIDAL_METRICS_BIND": f"127.0.0.1:{metrics_port}",
            "TIDAL_API_WORKERS": str(workers),
        }
        if threads:
            env["TIDAL_API_THREADS"] = str(threads)
        log_path = Path(log_dir or home) / "serve.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tidal_api.cli", "serve"],
                env=child_environ(**env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                url = f"http://127.0.0.1:{port}"
                _wait_ready(url, proc, log_path)
                yield url, key, f"http://127.0.0.1:{metrics_port}"
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                redis.Redis.from_url(queue_url).flushdb()


def _wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + "/openapi.json", timeout=2).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"tidal serve did not come up; log:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
