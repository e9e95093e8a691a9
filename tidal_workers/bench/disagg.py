"""A-D on one machine: a prefill engine, a decode engine, KV between them through TidalFreezeConnector, a router.

The router (:class:`Router`) speaks the OpenAI API. Disaggregated, it sends each request to the prefill engine with
``max_tokens`` 1 (the prompt's KV is frozen to the shared folder), then the whole request to the decode engine
(which thaws that KV instead of computing the prompt) and streams the decode engine's answer back. Unified, it sends
each whole request to the two engines in turn. Both arms run on the same two engines (the connector passes
untagged requests through), so the comparison is the placement only.

Online traffic (open loop, streamed, priority 0) and batch work (closed loop at priority 100, prefill-heavy) both go
through the router; the batch's in-flight count is the AIMD gate's target, read through the ``disagg`` signal map
from both engines' /metrics, so batch is admitted while the pools idle.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import http.server
import itertools
import json
import threading
import time
import typing as t

import psutil
import requests

from config import Settings
from tidal_engine.freeze import TAG
from tidal_workers.bench import online
from tidal_workers.bench.kv_probe import prompt
from tidal_workers.bench.stats import abba_order
from tidal_workers.bench.stats import interval
from tidal_workers.gate import AimdGate

DISAGG, UNIFIED = "disagg", "unified"
RIG_BATCH = "rig"  # the folder the rig's frozen KV goes to


class Router:
    """A small OpenAI-protocol router in front of a prefill and a decode engine; ``mode`` may change between runs."""

    def __init__(self, prefill_url: str, decode_url: str, mode: str = DISAGG, host: str = "127.0.0.1"):
        self.prefill_url, self.decode_url, self.mode = prefill_url, decode_url, mode
        self._turn = itertools.count()
        self.session = requests.Session()
        router = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                router.forward(self, body)

            def log_message(self, *args: t.Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def forward(self, handler: http.server.BaseHTTPRequestHandler, body: dict[str, t.Any]) -> None:
        if self.mode == DISAGG:
            tagged = {**body, "kv_transfer_params": {TAG: RIG_BATCH}}
            first = {k: v for k, v in tagged.items() if k not in ("stream", "stream_options", "max_completion_tokens")}
            pre = self.session.post(self.prefill_url + handler.path, json={**first, "max_tokens": 1}, timeout=300)
            if pre.status_code != 200:
                self._reply(handler, pre)
                return
            target, body = self.decode_url, tagged
        else:
            target = (self.prefill_url, self.decode_url)[next(self._turn) % 2]
        with self.session.post(target + handler.path, json=body, timeout=300, stream=True) as resp:
            self._reply(handler, resp)

    @staticmethod
    def _reply(handler: http.server.BaseHTTPRequestHandler, resp: requests.Response) -> None:
        handler.send_response(resp.status_code)
        handler.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
        handler.end_headers()  # HTTP/1.0: the body ends when the connection closes
        for chunk in resp.iter_content(chunk_size=None):
            handler.wfile.write(chunk)
            handler.wfile.flush()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclasses.dataclass(frozen=True)
class DisaggConfig:
    model: str = "dense"
    duration: float = 30.0
    online_rate: float = 1.0  # requests/s: what two engines on 2 shared cores sustain beside the batch
    online_prompt_tokens: int = 200
    online_max_tokens: int = 32
    batch_prompt_tokens: int = 1000  # batch work is prefill-heavy
    batch_max_tokens: int = 16
    max_inflight: int = 4
    reps: int = 2  # ABBA blocks: each rep runs the disaggregated arm and the unified one


def _batch_lane(
    router: Router, cfg: DisaggConfig, gate: AimdGate, stop_at: float, counts: dict[str, int]
) -> dict[str, int]:
    """Closed-loop batch requests through the router, as many in flight as the gate's target."""
    serial = itertools.count()
    inflight: set[concurrent.futures.Future[int]] = set()

    def one(n: int) -> int:
        body = {
            "model": cfg.model,
            "prompt": prompt(f"batch-{router.mode}-{time.time()}-{n}", cfg.batch_prompt_tokens),
            "max_tokens": cfg.batch_max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "priority": 100,
        }
        resp = requests.post(router.url + "/v1/completions", json=body, timeout=300)
        return int(resp.json()["usage"]["completion_tokens"]) if resp.status_code == 200 else -1

    with concurrent.futures.ThreadPoolExecutor(cfg.max_inflight) as pool:
        while time.time() < stop_at:
            target = gate.poll(time.time(), len(inflight))
            while len(inflight) < min(target, cfg.max_inflight):
                inflight.add(pool.submit(one, next(serial)))
            done, inflight = concurrent.futures.wait(inflight, timeout=0.2, return_when="FIRST_COMPLETED")
            for f in done:
                tokens = f.result()
                counts["errors" if tokens < 0 else "tokens"] += 1 if tokens < 0 else tokens
                counts["completed"] += tokens >= 0
    return counts


def run_arm(router: Router, mode: str, cfg: DisaggConfig, settings: Settings, pids: list[int]) -> dict[str, t.Any]:
    """One timed run of ``mode``: online samples, batch tokens harvested, the engines' CPU use."""
    router.mode = mode
    gate = AimdGate(settings)
    counts = {"tokens": 0, "completed": 0, "errors": 0}
    procs = [psutil.Process(p) for p in pids]
    children = [c for p in procs for c in p.children(recursive=True)] + procs
    for p in children:
        p.cpu_percent(None)
    started = time.time()
    stop_at = started + cfg.duration
    lane = threading.Thread(target=_batch_lane, args=(router, cfg, gate, stop_at, counts))
    lane.start()
    times = online.arrivals(online.flat(cfg.online_rate), cfg.duration, seed=int(started))
    texts = [prompt(f"online-{mode}-{started}-{i}", cfg.online_prompt_tokens) for i in range(len(times))]
    samples = asyncio.run(online.run_online(router.url, cfg.model, times, texts, cfg.online_max_tokens))
    lane.join()
    elapsed = time.time() - started
    cpu = sum(p.cpu_percent(None) for p in children if p.is_running()) / 100.0
    return {
        "mode": mode,
        "seconds": round(elapsed, 1),
        "batch_tokens_per_s": round(counts["tokens"] / elapsed, 2),
        "batch_completed": counts["completed"],
        "batch_errors": counts["errors"],
        "online": online.summarize(samples, cfg.duration),
        "engine_cpu_cores": round(cpu, 2),
    }


def run(router: Router, cfg: DisaggConfig, settings: Settings, pids: list[int]) -> list[dict[str, t.Any]]:
    """ABBA: disaggregated, unified, unified, disaggregated, ... ``reps`` blocks of two."""
    return [run_arm(router, mode, cfg, settings, pids) for _, mode in abba_order((DISAGG, UNIFIED), cfg.reps)]


# The figures per arm: (name, how to read it from an arm's record).
FIGURES: dict[str, t.Callable[[dict[str, t.Any]], float]] = {
    "batch_tokens_per_s": lambda arm: arm["batch_tokens_per_s"],
    "online_ttft_p50_s": lambda arm: arm["online"]["ttft_p50"],
    "online_ttft_p99_s": lambda arm: arm["online"]["ttft_p99"],
    "online_tbt_p99_s": lambda arm: arm["online"]["tbt_p99"],
    "engine_cpu_cores": lambda arm: arm["engine_cpu_cores"],
}


def summarize(arms: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    """Each figure per arm as a mean with its interval, and disaggregated ÷ unified within each ABBA block (a ratio
    whose interval spans 1.0 is no measurable change); the raw values stay in ``arms``."""
    by_mode = {mode: [a for a in arms if a["mode"] == mode] for mode in (DISAGG, UNIFIED)}
    blocks = list(zip(by_mode[DISAGG], by_mode[UNIFIED]))  # run() alternates the two arms block by block
    summary: dict[str, t.Any] = {
        mode: {name: interval([read(a) for a in runs]) for name, read in FIGURES.items()}
        for mode, runs in by_mode.items()
    }
    summary["disagg_over_unified"] = {
        name: interval([read(d) / read(u) for d, u in blocks if read(u)]) for name, read in FIGURES.items()
    }
    return summary
