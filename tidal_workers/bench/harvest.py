"""`tidal bench harvest`: how much of the offline ceiling Tidal harvests beside online load.

(a) ceiling   batch-only generation throughput at saturation (closed loop, straight to vLLM);
(b) baseline  the online load alone (flat or diurnal), streamed at priority 0;
(c) co-served the same online load while a Tidal worker drains a batch into the same engine,
              once per technique: A = AIMD gate + stock scheduler, B = TidalScheduler plugin.
Harvest = batch generation tokens/s in (c) / ceiling tokens/s. Latency inflation = (c) / (b)
for online TTFT and TBT percentiles.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import typing as t
from pathlib import Path

import httpx

from tidal_workers.bench import engine_stats, online
from tidal_workers.bench.stack import TidalStack


@dataclasses.dataclass
class HarvestConfig:
    engine_url: str
    model: str
    duration: float = 45.0
    online_rate: float = 4.0          # requests/s (mean, for diurnal)
    trace: str = "flat"               # flat | diurnal
    diurnal_period: float = 45.0
    online_prompt: str = "Tell me about the sea. " * 4
    online_max_tokens: int = 32
    batch_prompt: str = "Summarise this report: " + "tide data " * 40
    batch_max_tokens: int = 64
    ceiling_concurrency: int = 32
    budget_tokens: int = 2048         # the engine's max_num_batched_tokens
    technique: str = "A"              # which co-served run this engine is for: A or B
    max_inflight: int = 16

    def rate_fn(self) -> t.Callable[[float], float]:
        if self.trace == "diurnal":
            return online.diurnal(self.online_rate, 0.8, self.diurnal_period)
        return online.flat(self.online_rate)


def _batch_body(cfg: HarvestConfig, priority: int | None = None) -> dict:
    body = {"model": cfg.model, "max_tokens": cfg.batch_max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": cfg.batch_prompt}]}
    if priority is not None:
        body["priority"] = priority
    return body


async def _closed_loop(cfg: HarvestConfig) -> None:
    deadline = time.monotonic() + cfg.duration
    async with httpx.AsyncClient(timeout=300) as client:
        async def lane() -> None:
            while time.monotonic() < deadline:
                await client.post(f"{cfg.engine_url}/v1/chat/completions", json=_batch_body(cfg, 100))

        await asyncio.gather(*(lane() for _ in range(cfg.ceiling_concurrency)))


def measure_ceiling(cfg: HarvestConfig) -> dict:
    with engine_stats.Sampler(cfg.engine_url) as s:
        started = time.monotonic()
        asyncio.run(_closed_loop(cfg))
        elapsed = time.monotonic() - started
    return {"batch_tokens_per_s": engine_stats.delta(s.readings, "generation_tokens") / elapsed,
            "fill": engine_stats.budget_fill(s.readings, cfg.budget_tokens)}


def measure_online(cfg: HarvestConfig, stack: TidalStack | None = None) -> dict:
    """Run the online load; with a stack, Tidal harvests beside it. Returns latency and throughput."""
    times = online.arrivals(cfg.rate_fn(), cfg.duration)
    with engine_stats.Sampler(cfg.engine_url) as s:
        started = time.monotonic()
        samples = asyncio.run(online.run_online(cfg.engine_url, cfg.model, times, cfg.online_prompt,
                                                cfg.online_max_tokens))
        elapsed = time.monotonic() - started
    result = online.summarize(samples, elapsed)
    generated = engine_stats.delta(s.readings, "generation_tokens")
    online_tokens = sum(x.tokens for x in samples)
    result["batch_tokens_per_s"] = max(0.0, generated - online_tokens) / elapsed
    result["fill"] = engine_stats.budget_fill(s.readings, cfg.budget_tokens)
    result["ttft_samples"] = sorted(x.ttft for x in samples if x.ttft is not None)
    result["tbt_samples"] = sorted(g for x in samples for g in x.tbts)
    if stack is not None:
        result["items_completed"] = stack.completed_items()
    return result


def run_coserved(cfg: HarvestConfig, stack: TidalStack) -> dict:
    n = int(cfg.duration * 60) + 200  # more than the engine can finish in the window
    stack.submit(n, _batch_body(cfg))
    stack.wait_until_flowing()
    try:
        return measure_online(cfg, stack)
    finally:
        stack.cancel_all()


def inflation(co: dict, base: dict) -> dict:
    out = {}
    for key in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99"):
        if co.get(key) and base.get(key):
            out[key] = co[key] / base[key]
    return out


def write_results(results: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "harvest.json"
    slim = json.loads(json.dumps(results, default=str))
    for run in slim.get("runs", {}).values():
        run.pop("ttft_samples", None)
        run.pop("tbt_samples", None)
    path.write_text(json.dumps(slim, indent=2))
    plot(results, out_dir)
    return path


def plot(results: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, run in runs.items():
        if run.get("fill"):
            xs, ys = zip(*run["fill"])
            ax.plot(xs, [100 * y for y in ys], label=name)
    ax.set_xlabel("seconds")
    ax.set_ylabel("tokens per step, % of max_num_batched_tokens")
    ax.set_title("Budget fill over time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "harvest_fill.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, run in runs.items():
        for ax, key in zip(axes, ("ttft_samples", "tbt_samples")):
            values = run.get(key) or []
            if values:
                ax.plot([1000 * v for v in values], [i / len(values) for i in range(1, len(values) + 1)], label=name)
    axes[0].set_xlabel("online TTFT (ms)")
    axes[1].set_xlabel("online TBT (ms)")
    for ax in axes:
        ax.set_ylabel("CDF")
        ax.set_xscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "harvest_latency_cdf.png", dpi=110)
    plt.close(fig)
