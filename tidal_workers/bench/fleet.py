"""`tidal bench fleet`: batch work placed across replicas by their own gates, against all of it pinned to one.

Each replica carries its own online load, diurnal and phase-shifted (with two, one's peak is the other's
trough), sent straight to it at priority 0. Placement: one `tidal worker` per replica, each with its own node
name, engine URL and AIMD gate on that engine's /metrics, all claiming from the same queue, so an item goes to
whichever gate is open. Pinning: one worker, on replica 0, under the same online load. Nothing places work
explicitly: if batch work chases the troughs, it is because the gates open there.

Harvest is batch generation tokens/s over all replicas (each engine's generation counter minus the tokens of
its own online requests). A replica's batch share is its finished requests minus its online ones (the items
table does not record the node). Trough-following is the Pearson r, per replica, of batch tokens/s per
interval against that replica's online rate: negative when batch work fills the troughs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import math
import subprocess
import threading
import time
import typing as t
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func
from sqlalchemy import select

from config import Settings
from tidal_engine.serve import Engine
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import start_engine
from tidal_workers.bench import engine_stats
from tidal_workers.bench import online
from tidal_workers.bench.backlog import batch_body
from tidal_workers.bench.stack import TidalStack
from tidal_workers.store import Item
from tidal_workers.store import ItemStatus

SUCCESS = "vllm:request_success_total"
TOP_UP_ITEMS = 400  # submitted per top-up; small enough to be validated inline by POST /v1/batches


@dataclasses.dataclass
class FleetConfig:
    """One comparison. Defaults fit two tiny-model replicas on a 2-core CPU (docs/benchmarks.md)."""

    engine_urls: list[str]
    model: str = "tiny"
    period: float = 120.0  # seconds of one online "day"
    periods: float = 2.0
    online_rate: float = 4.0  # mean online requests/s per replica
    amplitude: float = 0.8
    online_prompt: str = "Tell me about the sea and the tides. " * 3
    online_max_tokens: int = 48
    batch_prompt: str = "Summarise this report: " + "tide data " * 40
    batch_max_tokens: int = 128
    max_inflight: int = 12  # each worker's gate ceiling
    interval: float = 5.0  # seconds per bin of the fill series and the correlation

    @property
    def duration(self) -> float:
        return self.period * self.periods

    def rate_fn(self, replica: int) -> t.Callable[[float], float]:
        """Replica ``i``'s online rate: the same day, shifted by ``i / replicas`` of a period."""
        day = online.diurnal(self.online_rate, self.amplitude, self.period)
        shift = self.period * replica / len(self.engine_urls)
        return lambda now: day(now + shift)


def start_replicas(model_dir: Path, count: int, log_dir: Path, max_num_seqs: int) -> list[Engine]:
    """``count`` tiny engines started at once, replica ``i`` bound to core ``i`` (unbound, both would share core 0)."""
    options = EngineOptions(model=str(model_dir), served_model_name="tiny", max_num_seqs=max_num_seqs)
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [
            pool.submit(
                start_engine, options, log_path=log_dir / f"engine-{i}.log", env={"VLLM_CPU_OMP_THREADS_BIND": str(i)}
            )
            for i in range(count)
        ]
        concurrent.futures.wait(futures)
    failed = [exc for f in futures if (exc := f.exception())]
    if failed:
        for f in futures:
            if not f.exception():
                f.result().stop()
        raise failed[0]
    return [f.result() for f in futures]


def node_name(replica: int) -> str:
    return f"replica-{replica}"


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _pending(stack: TidalStack) -> int:
    with stack.rt.store.read() as s:
        return int(s.scalar(select(func.count()).where(Item.status == ItemStatus.pending.value)) or 0)


def _top_up(stack: TidalStack, cfg: FleetConfig, stop: threading.Event) -> None:
    """Keep at least two top-ups' worth of items pending, so the queue never runs dry and no giant file is
    validated up front."""
    sent = 0
    while not stop.is_set():
        if _pending(stack) < 2 * TOP_UP_ITEMS:
            stack.submit([batch_body(cfg, sent + i) for i in range(TOP_UP_ITEMS)])
            sent += TOP_UP_ITEMS
        stop.wait(1.0)


def successes(engine_url: str) -> float:
    """Requests the engine has finished (every finish reason)."""
    text = requests.get(f"{engine_url}/metrics", timeout=5).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == SUCCESS)


def run_mode(cfg: FleetConfig, settings: Settings, mode: str, home: Path) -> dict:
    """One run: ``placement`` (a worker per replica) or ``pinning`` (one worker, on replica 0)."""
    urls = cfg.engine_urls
    workers = len(urls) if mode == "placement" else 1
    stack = TidalStack(
        settings, urls[0], home, gate_mode="aimd", max_inflight=cfg.max_inflight, extra_env={"TIDAL_NODE": node_name(0)}
    )
    extra: list[subprocess.Popen] = []
    stop = threading.Event()
    topper = threading.Thread(target=_top_up, args=(stack, cfg, stop), daemon=True)
    try:
        extra = [stack.spawn_worker(urls[i], node_name(i), max_inflight=cfg.max_inflight) for i in range(1, workers)]
        topper.start()
        stack.wait_until_flowing(timeout=180)
        time.sleep(3.0)  # let the gates reach their steady state before the window opens
        return measure(cfg, stack)
    finally:
        stop.set()
        topper.join(30)
        stack.cancel_all()
        for p in extra:
            _stop(p)
        stack.close()
        for url in urls:
            engine_stats.wait_idle(url, timeout=300)


def measure(cfg: FleetConfig, stack: TidalStack) -> dict:
    """The online load on every replica at once while the workers harvest; per-replica series and totals."""
    urls = cfg.engine_urls
    times = [online.arrivals(cfg.rate_fn(i), cfg.duration, seed=7 + i) for i in range(len(urls))]
    before_items = stack.progress()
    before_ok = [successes(u) for u in urls]
    with contextlib.ExitStack() as running:
        samplers = [running.enter_context(engine_stats.Sampler(u)) for u in urls]
        t0 = time.monotonic()
        samples = asyncio.run(_online_all(cfg, times))
        elapsed = time.monotonic() - t0
    after_ok = [successes(u) for u in urls]
    after_items = stack.progress()
    replicas = []
    for i, url in enumerate(urls):
        ok = [x for x in samples[i] if x.ttft is not None]
        series = batch_series(samplers[i].readings, ok, t0, cfg.interval, elapsed)
        rates = [cfg.rate_fn(i)(mid) for mid, _ in series]
        fill = [v for _, v in series]
        batch_tokens = engine_stats.delta(samplers[i].readings, "generation_tokens") - sum(x.tokens for x in ok)
        replicas.append(
            {
                "url": url,
                "online": online.summarize(samples[i], elapsed),
                "batch_items": after_ok[i] - before_ok[i] - len(ok),
                "batch_tokens_per_s": batch_tokens / elapsed,
                "fill_vs_online_rate_r": pearson(fill, rates),
                "series": [{"t": mid, "online_rate": r, "batch_tokens_per_s": v} for (mid, v), r in zip(series, rates)],
            }
        )
    return {
        "seconds": elapsed,
        "batch_tokens_per_s": sum(r["batch_tokens_per_s"] for r in replicas),
        "tidal_items_completed": after_items.items - before_items.items,
        "tidal_output_tokens_per_s": (after_items.output_tokens - before_items.output_tokens) / elapsed,
        "replicas": replicas,
    }


async def _online_all(cfg: FleetConfig, times: list[list[float]]) -> list[list[online.OnlineSample]]:
    runs = [
        online.run_online(url, cfg.model, ts, cfg.online_prompt, cfg.online_max_tokens)
        for url, ts in zip(cfg.engine_urls, times)
    ]
    return list(await asyncio.gather(*runs))


def batch_series(
    readings: list[engine_stats.Reading], ok: list[online.OnlineSample], t0: float, interval: float, duration: float
) -> list[tuple[float, float]]:
    """(bin midpoint, batch tokens/s) per ``interval``: the engine's generated tokens in the bin minus the online
    requests' tokens, each request's spread evenly over its own life (first to last token)."""
    at = [r.at - t0 for r in readings]
    counter = [r.generation_tokens for r in readings]
    edges = [k * interval for k in range(int(duration // interval) + 1)]
    out = []
    for lo, hi in itertools.pairwise(edges):
        generated = _interp(at, counter, hi) - _interp(at, counter, lo)
        online_tokens = sum(x.tokens * _overlap(x, lo, hi) for x in ok)
        out.append(((lo + hi) / 2, (generated - online_tokens) / interval))
    return out


def _overlap(sample: online.OnlineSample, lo: float, hi: float) -> float:
    """The fraction of the request's life (submission to its last token) that falls in [lo, hi)."""
    assert sample.ttft is not None  # only answered requests are spread over bins
    start, end = sample.start, sample.start + sample.ttft + sum(sample.tbts)
    if end <= start:
        return 1.0 if lo <= start < hi else 0.0
    return max(0.0, min(end, hi) - max(start, lo)) / (end - start)


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """A counter's value at ``x``, linear between readings, held flat beyond them."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return ys[-1]


def pearson(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def summary(placement: dict, pinning: dict) -> dict:
    base = pinning["batch_tokens_per_s"]
    return {
        "harvest_tokens_per_s": {"placement": placement["batch_tokens_per_s"], "pinning": base},
        "placement_vs_pinning_pct": 100 * (placement["batch_tokens_per_s"] / base - 1) if base > 0 else None,
        "batch_items_per_replica": {
            m: [round(r["batch_items"]) for r in run["replicas"]]
            for m, run in (("placement", placement), ("pinning", pinning))
        },
        "tidal_items_completed": {
            "placement": placement["tidal_items_completed"],
            "pinning": pinning["tidal_items_completed"],
        },
        "fill_vs_online_rate_r": {
            m: [r["fill_vs_online_rate_r"] for r in run["replicas"]]
            for m, run in (("placement", placement), ("pinning", pinning))
        },
        "online_ttft_p99": {
            m: [r["online"]["ttft_p99"] for r in run["replicas"]]
            for m, run in (("placement", placement), ("pinning", pinning))
        },
        "online_errors": {
            m: sum(r["online"]["errors"] for r in run["replicas"])
            for m, run in (("placement", placement), ("pinning", pinning))
        },
    }


def plot(results: dict, path: Path) -> None:
    """Per replica: its online rate (left axis) and its batch fill in both runs (right axis), over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    count = len(runs["placement"]["replicas"])
    fig, axes = plt.subplots(count, 1, figsize=(9, 2.8 * count), sharex=True, squeeze=False)
    for i, ax in enumerate(axes[:, 0]):
        series = runs["placement"]["replicas"][i]["series"]
        ax.fill_between(
            [p["t"] for p in series],
            [p["online_rate"] for p in series],
            color="tab:orange",
            alpha=0.25,
            label="online rate (req/s)",
        )
        ax.set_ylabel(f"replica {i}\nonline req/s")
        right = ax.twinx()
        for mode, style in (("placement", "-"), ("pinning", "--")):
            pts = runs[mode]["replicas"][i]["series"]
            r = runs[mode]["replicas"][i]["fill_vs_online_rate_r"]
            right.plot(
                [p["t"] for p in pts],
                [max(0.0, p["batch_tokens_per_s"]) for p in pts],
                style,
                color="tab:blue",
                label=f"batch tok/s, {mode} (r={r:+.2f})" if r is not None else mode,
            )
        right.set_ylabel("batch tokens/s")
        lines = ax.get_legend_handles_labels()
        more = right.get_legend_handles_labels()
        right.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds into the run")
    s = results["summary"]
    fig.suptitle(
        f"Fleet placement: harvest {s['harvest_tokens_per_s']['placement']:.0f} vs "
        f"{s['harvest_tokens_per_s']['pinning']:.0f} batch tok/s pinned "
        f"({s['placement_vs_pinning_pct']:+.0f}%)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
