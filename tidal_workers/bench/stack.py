"""A private Tidal (store, Redis DB, one `tidal worker` process and its ops worker) feeding one engine, for benchmarks.

Batches go in through the real API code (the Flask app in-process), and the
worker is the same command production runs, so a benchmark measures Tidal
itself rather than a shortcut around it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func
from sqlalchemy import select

from config import Settings
from config.settings import child_environ
from config.settings import env_name
from tidal_engine.serve import free_port
from tidal_workers.bench import histograms
from tidal_workers.gate import pool_threads
from tidal_workers.runtime import Runtime
from tidal_workers.store import Item
from tidal_workers.store import ItemStatus
from tidal_workers.store import api_keys

BENCH_REDIS_DB = 14
# The worker's series ``TidalStack.gate`` reads (the warm-up requests only where they were answered: outcome "sent").
GATE_SERIES = (
    "tidal_gate_target",
    "tidal_gate_inflight",
    "tidal_gate_engine_outstanding",
    "tidal_prefill_stage_tokens_total",
    "tidal_gate_reference_itl_seconds",
    "tidal_gate_inflation",
    "tidal_gate_online_requests_per_second",
    "tidal_gate_profile_level",
    "tidal_gate_steered_inflation",
)


@dataclasses.dataclass(frozen=True)
class Progress:
    items: int
    output_tokens: int


class TidalStack:
    def __init__(
        self,
        base: Settings,
        engine_url: str,
        home: Path,
        *,
        gate_mode: str = "aimd",
        max_inflight: int = 16,
        extra_env: dict[str, str] | None = None,
        redis_db: int = BENCH_REDIS_DB,
    ):
        redis_url = base.redis_url.rsplit("/", 1)[0] + f"/{redis_db}"
        self.settings = base.replace(
            home=str(home),
            database_url="",
            blob_dir="",
            redis_url=redis_url,
            broker_url="",
            vllm_url=engine_url,
            env="dev",
            node="bench-node",
            max_inflight=max_inflight,
        )
        self.rt = Runtime(self.settings)
        self.rt.redis.flushdb()
        self.rt.store.migrate()
        api_keys.sync(self.rt.store)
        from tidal_api import create_app

        self.client = create_app(runtime=self.rt).test_client()
        self.headers = {"Authorization": "Bearer tidal-dev-key"}
        home.mkdir(parents=True, exist_ok=True)
        self.log = open(home / "worker.log", "ab")
        self.metrics_port = free_port()  # several stacks may share the host
        self.worker = self.spawn_worker(
            engine_url,
            "bench-node",
            gate_mode=gate_mode,
            max_inflight=max_inflight,
            metrics_port=self.metrics_port,
            extra_env=extra_env,
        )
        self.ops = self.spawn_worker(engine_url, "bench-ops", ops=True)  # finalization runs there, as deployed
        self.batch_ids: list[str] = []

    def spawn_worker(
        self,
        engine_url: str,
        node: str,
        *,
        gate_mode: str = "aimd",
        max_inflight: int = 16,
        metrics_port: int = 0,
        extra_env: dict[str, str] | None = None,
        ops: bool = False,
    ) -> subprocess.Popen:
        """A `tidal worker` process (with ``ops``: `tidal worker --ops`) on this stack's store and Redis DB,
        feeding ``engine_url`` as ``node``."""
        s = self.settings
        env = {
            env_name("home"): s.home,
            env_name("database_url"): "",
            env_name("blob_dir"): "",
            env_name("redis_url"): s.redis_url,
            env_name("broker_url"): "",
            env_name("vllm_url"): engine_url,
            env_name("env"): "dev",
            env_name("gate_mode"): gate_mode,
            env_name("max_inflight"): str(max_inflight),
            env_name("initial_inflight"): str(max_inflight),
            env_name("node"): node,
            env_name("dispatch_prefetch"): str(s.dispatch_prefetch),  # the base settings' (env or a benchmark's)
            env_name("worker_threads"): str(
                max(16, pool_threads(s.replace(max_inflight=max_inflight, worker_threads=0)))
            ),
            env_name("worker_metrics_port"): str(metrics_port),
            **(extra_env or {}),
        }
        return subprocess.Popen(
            [sys.executable, "-m", "tidal_api.cli", "worker", *(["--ops"] if ops else [])],
            env=child_environ(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def submit(self, bodies: list[dict], endpoint: str = "/v1/chat/completions") -> str:
        """Upload one request line per body and create a batch of them through the API; returns its id."""
        lines = (
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": endpoint, "body": body})
            for i, body in enumerate(bodies)
        )
        data = ("\n".join(lines) + "\n").encode()
        up = self.client.post(
            "/v1/files", headers=self.headers, data={"purpose": "batch", "file": (io.BytesIO(data), "bench.jsonl")}
        )
        assert up.status_code == 200, up.get_data(as_text=True)
        created = self.client.post(
            "/v1/batches",
            headers=self.headers,
            json={"input_file_id": up.get_json()["id"], "endpoint": endpoint, "completion_window": "24h"},
        )
        assert created.status_code == 200, created.get_data(as_text=True)
        self.batch_ids.append(created.get_json()["id"])
        return self.batch_ids[-1]

    def batch(self, batch_id: str) -> dict:
        return self.client.get(f"/v1/batches/{batch_id}", headers=self.headers).get_json()

    def progress(self) -> Progress:
        """Items completed so far and the output tokens the engine reported for them (from SQL)."""
        with self.rt.store.read() as s:
            count, tokens = s.execute(
                select(func.count(), func.coalesce(func.sum(Item.output_tokens), 0)).where(
                    Item.status == ItemStatus.completed.value
                )
            ).one()
        return Progress(int(count), int(tokens))

    def gate(self) -> dict[str, float]:
        """The worker's gate as it exports it: ``tidal_gate_target``, ``tidal_gate_inflight`` (leases held) and
        ``tidal_gate_engine_outstanding`` (batch requests at the engine); the latency gate's reference and inflation
        (NaN until known); and staged prefill's answered warm-ups,
        ``tidal_prefill_stages_total`` and their prompt tokens ``tidal_prefill_stage_tokens_total`` (work the
        engine's counters hold that is not the batch's output)."""
        return {
            s.name: s.value
            for family in text_string_to_metric_families(self.metrics_page())
            for s in family.samples
            if s.name in GATE_SERIES or (s.name == "tidal_prefill_stages_total" and s.labels.get("outcome") == "sent")
        }

    def histograms(self) -> dict[str, list[tuple[float, float]]]:
        """The worker's dispatch histograms now (cumulative buckets): two readings give a window's delta."""
        return histograms.buckets(self.metrics_page())

    def metrics_page(self) -> str:
        """The worker's /metrics page now (one reading for ``histograms.buckets`` and ``histograms.sums`` alike)."""
        return requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def worker_cpu_seconds(self) -> float:
        """CPU time the worker process has used (user + system): its share of the machine's cores."""
        fields = Path(f"/proc/{self.worker.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def completed_items(self) -> int:
        return self.progress().items

    def wait_until_flowing(self, timeout: float = 120.0) -> None:
        """Block until the worker has finished at least one item (engine warm, gate open)."""
        deadline = time.monotonic() + timeout
        while self.completed_items() == 0:
            if self.worker.poll() is not None:
                raise RuntimeError(f"tidal worker exited ({self.worker.returncode}); see {self.log.name}")
            if time.monotonic() > deadline:
                raise TimeoutError("no batch item completed; see the worker log")
            time.sleep(0.5)

    def wait_done(self, batch_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while (b := self.batch(batch_id))["status"] not in ("completed", "failed", "expired", "cancelled"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still {b['status']}")
            time.sleep(0.5)
        return b

    def cancel_all(self) -> None:
        for batch_id in self.batch_ids:
            self.client.post(f"/v1/batches/{batch_id}/cancel", headers=self.headers)

    def close(self) -> None:
        for proc in (self.worker, self.ops):
            proc.terminate()
        for proc in (self.worker, self.ops):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()
        self.rt.redis.flushdb()
        self.rt.close()

    def __enter__(self) -> TidalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LOCK_REDIS_DB = 15  # tests/conftest.py's: one key per Redis DB a test session holds


@contextlib.contextmanager
def reserved_redis_db(base: Settings, hours: float = 6.0) -> t.Iterator[int]:
    """A second private Redis DB for a benchmark that runs two Tidals at once (the fleet's static split): taken
    from the test sessions' pool (13 down to 1) under their own lock key, so neither flushes the other's."""
    import redis

    locks = redis.Redis.from_url(base.redis_url.rsplit("/", 1)[0] + f"/{LOCK_REDIS_DB}")
    for db in range(13, 0, -1):
        key = f"tidal:test-db:{db}"
        if locks.set(key, "bench", nx=True, ex=int(hours * 3600)):
            try:
                yield db
            finally:
                locks.delete(key)
            return
    raise RuntimeError("Redis DBs 1-13 are all held by test sessions; the split arm needs one")
