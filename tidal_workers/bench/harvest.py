"""`tidal bench harvest`: how much of the offline ceiling Tidal harvests beside online load.

(a) ceiling   batch-only generation throughput at saturation (closed loop, straight to vLLM);
(b) baseline  the online load alone (flat or diurnal), streamed at priority 0;
(c) co-served the same online load while a Tidal worker drains a batch into the same engine,
              once per technique: A = AIMD gate + stock scheduler, B = the same + TidalScheduler.
Harvest = batch generation tokens/s in (c) / ceiling tokens/s. Latency inflation = (c) / (b)
for online TTFT, TBT and end-to-end percentiles.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import time
import typing as t
from pathlib import Path

import httpx

from tidal_workers.bench import engine_stats
from tidal_workers.bench import histograms
from tidal_workers.bench import online
from tidal_workers.bench.stack import TidalStack

RESOLUTION_S = 0.001  # below this a client-side latency is scheduling noise on a shared 2-core machine


@dataclasses.dataclass
class HarvestConfig:
    """One engine's experiment. Defaults fit the tiny model on a 2-core CPU (docs/benchmarks.md says why)."""

    engine_url: str
    model: str
    duration: float = 30.0
    online_rate: float = 4.0  # requests/s (mean, for diurnal)
    trace: str = "flat"  # flat | diurnal
    diurnal_period: float = 30.0
    online_prompt: str = "Tell me about the sea and the tides. " * 3
    online_max_tokens: int = 48
    batch_prompt: str = "Summarise this report: " + "tide data " * 40  # about 420 tokens on the local models
    batch_max_tokens: int = 128
    ceiling_concurrency: int = 12  # = the worker's gate ceiling: the most batch work Tidal may have in flight
    budget_tokens: int = 2048  # the engine's max_num_batched_tokens
    plugin_metrics_url: str | None = None  # TidalScheduler's endpoint, when the engine runs it

    def rate_fn(self) -> t.Callable[[float], float]:
        if self.trace == "diurnal":
            return online.diurnal(self.online_rate, 0.8, self.diurnal_period)
        return online.flat(self.online_rate)


def report_prompt(num_bytes: int) -> str:
    """A batch prompt of ``num_bytes`` bytes, the default's text repeated (one token per byte on the local models)."""
    head = "Summarise this report: "
    return head + ("tide data " * (num_bytes // 10 + 1))[: max(num_bytes - len(head), 0)]


class BatchShape(t.Protocol):
    """What a batch request is made of (HarvestConfig and FleetConfig both say)."""

    model: str
    batch_prompt: str
    batch_max_tokens: int


def batch_body(cfg: BatchShape, n: int, priority: int | None = None) -> dict:
    """The n-th batch request. Its number comes first, so no two share a prefix: otherwise vLLM's prefix
    cache would serve every prefill after the first and the batch would cost only its decodes."""
    body = {
        "model": cfg.model,
        "max_tokens": cfg.batch_max_tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": f"[{n}] {cfg.batch_prompt}"}],
    }
    if priority is not None:
        body["priority"] = priority
    return body


async def _closed_loop(cfg: HarvestConfig, lanes: int, duration: float) -> int:
    """``lanes`` batch requests (priority 100) always in flight straight to vLLM for ``duration`` seconds,
    as a gate with a fixed target would keep them; returns how many completed."""
    deadline = time.monotonic() + duration
    sent = itertools.count()
    done = 0
    async with httpx.AsyncClient(timeout=300) as client:

        async def lane() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                resp = await client.post(f"{cfg.engine_url}/v1/chat/completions", json=batch_body(cfg, next(sent), 100))
                resp.raise_for_status()
                done += 1

        await asyncio.gather(*(lane() for _ in range(lanes)))
    return done


def _engine_side(readings: list[engine_stats.Reading], cfg: HarvestConfig) -> dict:
    return {
        "load_average_1m": os.getloadavg()[0],  # the machine is shared: how busy it was
        "fill": engine_stats.budget_fill(readings, cfg.budget_tokens),
        "generation_rate": engine_stats.generation_rate(readings),
        **engine_stats.step_rate(readings),
    }


def warm_up(cfg: HarvestConfig, seconds: float = 10.0) -> None:
    """Unmeasured load on a fresh engine: online at the diurnal peak beside a full backlog.

    A fresh CPU engine is slow for its first seconds of load: measured on the dense model, the same
    online-only diurnal phase had a TTFT p50 of 281 ms on a fresh engine and 18–47 ms after this warm-up,
    and the first phase on each engine is a baseline, the denominator of every inflation ratio.
    """
    peak = dataclasses.replace(cfg, duration=seconds, online_rate=cfg.online_rate * 1.8, trace="flat")
    online_beside_backlog(peak, cfg.ceiling_concurrency)
    engine_stats.wait_idle(cfg.engine_url)


def measure_ceiling(cfg: HarvestConfig) -> dict:
    """Batch only, straight to vLLM, ``ceiling_concurrency`` requests always in flight."""
    with engine_stats.Sampler(cfg.engine_url) as s:
        started = time.monotonic()
        done = asyncio.run(_closed_loop(cfg, cfg.ceiling_concurrency, cfg.duration))
        elapsed = time.monotonic() - started
    engine_stats.wait_idle(cfg.engine_url)
    return {
        "batch_tokens_per_s": engine_stats.delta(s.readings, "generation_tokens") / elapsed,
        "requests_completed": done,
        "seconds": elapsed,
        **_engine_side(s.readings, cfg),
    }


def measure_online(cfg: HarvestConfig, stack: TidalStack | None = None) -> dict:
    """Run the online load; with a stack, Tidal harvests beside it. Returns latency and throughput.

    Batch tokens/s is the engine's generation counter minus the online requests' own usage; with a stack it is
    cross-checked against what Tidal recorded: items completed in the window and their output tokens (SQL).
    """
    times = online.arrivals(cfg.rate_fn(), cfg.duration)
    before = stack.progress() if stack else None
    cpu_before = stack.worker_cpu_seconds() if stack else None
    hist_before = stack.histograms() if stack else None
    plugin_before = engine_stats.read_plugin(cfg.plugin_metrics_url) if cfg.plugin_metrics_url else None
    with engine_stats.Sampler(cfg.engine_url, also=stack.gate if stack else None) as s:
        started = time.monotonic()
        samples = asyncio.run(
            online.run_online(cfg.engine_url, cfg.model, times, cfg.online_prompt, cfg.online_max_tokens)
        )
        elapsed = time.monotonic() - started
    result = online.summarize(samples, elapsed)
    generated = engine_stats.delta(s.readings, "generation_tokens")
    online_tokens = sum(x.tokens for x in samples)
    result["seconds"] = elapsed
    result["batch_tokens_per_s"] = max(0.0, generated - online_tokens) / elapsed
    result.update(_engine_side(s.readings, cfg))
    result["ttft_samples"] = sorted(x.ttft for x in samples if x.ttft is not None)
    result["tbt_samples"] = sorted(g for x in samples for g in x.tbts)
    if stack is not None and before is not None and cpu_before is not None:
        after = stack.progress()
        items = after.items - before.items
        result["tidal_items_completed"] = items
        result["tidal_output_tokens_per_s"] = (after.output_tokens - before.output_tokens) / elapsed
        result["tidal_items_x_max_tokens_per_s"] = items * cfg.batch_max_tokens / elapsed
        result["worker_cpu_cores"] = (stack.worker_cpu_seconds() - cpu_before) / elapsed
        result["gate"] = [
            (at, g.get("tidal_gate_target"), g.get("tidal_gate_inflight"), g.get("tidal_gate_engine_outstanding"))
            for at, g in s.also_readings
        ]
        if hist_before is not None:  # engine token freed → next POST, POST time, POST end → lease released
            hist_after = stack.histograms()
            result["dispatch"] = {
                name: histograms.summarize_histogram(histograms.delta(hist_after[name], hist_before[name]))
                for name in histograms.HISTOGRAMS
            }
        for key in ("target", "inflight", "engine_outstanding"):
            seen = [g[f"tidal_gate_{key}"] for _, g in s.also_readings if f"tidal_gate_{key}" in g]
            result[f"gate_{key}_mean"] = sum(seen) / len(seen) if seen else None
    if plugin_before is not None and cfg.plugin_metrics_url:
        result["plugin"] = _plugin_delta(plugin_before, engine_stats.read_plugin(cfg.plugin_metrics_url))
    return result


def online_beside_backlog(cfg: HarvestConfig, lanes: int) -> list[online.OnlineSample]:
    """The online load while ``lanes`` batch requests are kept in flight straight to vLLM (no Tidal):
    the engine-level comparison of a scheduler with and without the plugin under the same backlog."""
    times = online.arrivals(cfg.rate_fn(), cfg.duration)

    async def both() -> list[online.OnlineSample]:
        backlog = asyncio.create_task(_closed_loop(cfg, lanes, cfg.duration + 1.0))
        await asyncio.sleep(1.0)  # the backlog is in the engine before the first online request
        samples = await online.run_online(cfg.engine_url, cfg.model, times, cfg.online_prompt, cfg.online_max_tokens)
        await backlog
        return samples

    return asyncio.run(both())


def _plugin_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """The plugin's state over the window: gauges as last seen, counters as increments."""
    counters = ("_total",)
    return {k: (v - before.get(k, 0.0)) if k.endswith(counters) else v for k, v in after.items()}


def run_coserved(cfg: HarvestConfig, stack: TidalStack) -> dict:
    n = int(cfg.duration * 60) + 200  # more than the engine can finish in the window
    stack.submit([batch_body(cfg, i) for i in range(n)])
    stack.wait_until_flowing()
    time.sleep(3.0)  # let the gate reach its steady state before the window opens
    try:
        return measure_online(cfg, stack)
    finally:
        stack.cancel_all()


def summary(co: dict, base: dict, ceiling: float | None) -> dict:
    """The headline of one co-served run against its baseline and the ceiling."""
    out = {
        "harvest_pct": 100 * co["batch_tokens_per_s"] / ceiling if ceiling else None,
        "batch_tokens_per_s": co["batch_tokens_per_s"],
        "tidal_items_x_max_tokens_per_s": co.get("tidal_items_x_max_tokens_per_s"),
        "online_tokens_per_s": co["tokens_per_s"],
        "online_errors": co["errors"],
        "worker_cpu_cores": co.get("worker_cpu_cores"),
        "gate_target_mean": co.get("gate_target_mean"),
        "gate_inflight_mean": co.get("gate_inflight_mean"),
        "load_average_1m": co.get("load_average_1m"),
        "inflation": inflation(co, base),
    }
    if "plugin" in co:
        out["plugin"] = {
            k: co["plugin"].get(k)
            for k in (
                "tidal_sched_model_r2",
                "tidal_sched_slack_fill_ratio",
                "tidal_sched_batch_cap_tokens",
                "tidal_sched_evictions_total",
            )
        }
    return out


def inflation(co: dict, base: dict) -> dict:
    out = {}
    """Co-served over baseline, per percentile. A baseline under the client's resolution (tokens that reach
    it bunched in one read give gaps of ~0) makes a ratio meaningless: None then, the raw values stay in runs."""
    for key in ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p90", "tbt_p99", "e2e_p50", "e2e_p99"):
        if co.get(key) is not None and (base.get(key) or 0) >= RESOLUTION_S:
            out[key] = co[key] / base[key]
        else:
            out[key] = None
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
    ceiling = runs.get("ceiling", {}).get("batch_tokens_per_s")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, run in runs.items():
        if run.get("generation_rate") and ceiling:
            xs, ys = zip(*run["generation_rate"])
            smooth = [sum(ys[max(0, i - 2) : i + 1]) / len(ys[max(0, i - 2) : i + 1]) for i in range(len(ys))]
            ax.plot(
                xs,
                [100 * y / ceiling for y in smooth],
                label=name,
                lw=1.8 if name.startswith("coserved") else 0.9,
                ls="-" if not name.startswith("baseline") else ":",
            )
    ax.axhline(100, color="grey", lw=0.6)
    ax.set_xlabel("seconds into the phase")
    ax.set_ylabel("generated tokens/s, % of the offline ceiling")
    ax.set_title("Fill over time (online + batch, 3 s moving mean; baselines dotted)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out_dir / "harvest_fill.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, run in runs.items():
        if name == "ceiling":
            continue
        for ax, key in zip(axes, ("ttft_samples", "tbt_samples")):
            values = run.get(key) or []
            values = [v for v in values if v >= RESOLUTION_S / 10]  # a log axis: drop bunched ~0 gaps
            if values:
                ax.plot([1000 * v for v in values], [i / len(values) for i in range(1, len(values) + 1)], label=name)
    axes[0].set_xlabel("online TTFT (ms)")
    axes[1].set_xlabel("online TBT (ms; gaps under 0.1 ms left out)")
    for ax in axes:
        ax.set_ylabel("CDF")
        ax.set_xscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "harvest_latency_cdf.png", dpi=110)
    plt.close(fig)
