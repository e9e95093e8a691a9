"""`tidal bench ...`: benchmarks (not tests). Paste their output into docs/benchmarks.md."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import platform
from pathlib import Path

import click

from config import load_settings


@click.group()
def bench() -> None:
    """Measurements of Tidal; each prints JSON and writes plots under --out."""


def machine() -> str:
    import os

    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"


@contextlib.contextmanager
def _engine(url: str | None, plugin: bool, log_dir: Path, max_num_seqs: int):
    """The engine to measure: a URL as given, or the tiny local one started (and stopped) here."""
    if url:
        yield url
        return
    from tidal_engine.serve import EngineOptions, scheduler_env, start_engine
    from tidal_engine.tiny import build_tiny

    settings = load_settings()
    opts = EngineOptions(model=str(build_tiny(settings.home)), served_model_name="tiny", tidal_scheduler=plugin,
                         max_num_seqs=max_num_seqs)
    engine = start_engine(opts, log_path=log_dir / f"engine-{'B' if plugin else 'A'}.log",
                          env=scheduler_env(settings))
    try:
        yield engine.url
    finally:
        engine.stop()


@bench.command()
@click.option("--engine-url", help="Engine for technique A (stock scheduler). Default: start the tiny local engine.")
@click.option("--engine-b-url", help="Engine running TidalScheduler, for technique B. Default: start the tiny one.")
@click.option("--techniques", default="A,B", show_default=True, help="Which co-served runs to make.")
@click.option("--model", default="tiny", show_default=True)
@click.option("--duration", default=40.0, show_default=True, help="Seconds per phase.")
@click.option("--rate", default=4.0, show_default=True, help="Online requests/s (the mean, for diurnal).")
@click.option("--trace", type=click.Choice(["flat", "diurnal", "both"]), default="flat", show_default=True)
@click.option("--max-inflight", default=16, show_default=True, help="Gate ceiling of the harvesting worker.")
@click.option("--max-num-seqs", default=32, show_default=True, help="Slots of a locally started engine.")
@click.option("--budget-tokens", default=2048, show_default=True, help="The engine's max_num_batched_tokens.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-out/harvest", show_default=True)
def harvest(engine_url, engine_b_url, techniques, model, duration, rate, trace, max_inflight, max_num_seqs,
            budget_tokens, out) -> None:
    """Offline ceiling, online baseline and co-served harvest, technique A against B."""
    from tidal_workers.bench import harvest as hv
    from tidal_workers.bench.stack import TidalStack

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = load_settings()
    traces = ["flat", "diurnal"] if trace == "both" else [trace]
    results: dict = {"command": "tidal bench harvest", "machine": machine(), "date": dt.date.today().isoformat(),
                     "params": {"duration": duration, "rate": rate, "traces": traces, "max_inflight": max_inflight,
                                "max_num_seqs": max_num_seqs}, "runs": {}, "summary": {}}
    ceiling = None
    for technique in [t.strip() for t in techniques.split(",") if t.strip()]:
        plugin = technique == "B"
        url = engine_b_url if plugin else engine_url
        with _engine(url, plugin, out_dir, max_num_seqs) as live_url:
            base_cfg = hv.HarvestConfig(engine_url=live_url, model=model, duration=duration, online_rate=rate,
                                        budget_tokens=budget_tokens, max_inflight=max_inflight, technique=technique)
            if ceiling is None:
                click.echo(f"[{technique}] offline ceiling ...", err=True)
                results["runs"]["ceiling"] = hv.measure_ceiling(base_cfg)
                ceiling = results["runs"]["ceiling"]["batch_tokens_per_s"]
            for tr in traces:
                cfg = dataclasses.replace(base_cfg, trace=tr, diurnal_period=duration)
                click.echo(f"[{technique}] online-only baseline, {tr} ...", err=True)
                base = results["runs"][f"baseline-{tr}-{technique}"] = hv.measure_online(cfg)
                click.echo(f"[{technique}] co-served, {tr} ...", err=True)
                # A: the AIMD gate decides how much batch work is in flight. B: the plugin packs
                # each step, so the worker keeps it supplied (fixed gate at the ceiling).
                with TidalStack(settings, live_url, out_dir / f"stack-{technique}-{tr}",
                                gate_mode="fixed" if plugin else "aimd", max_inflight=max_inflight) as stack:
                    co = results["runs"][f"coserved-{tr}-{technique}"] = hv.run_coserved(cfg, stack)
                results["summary"][f"{tr}-{technique}"] = {
                    "harvest_pct": 100 * co["batch_tokens_per_s"] / ceiling if ceiling else None,
                    "batch_tokens_per_s": co["batch_tokens_per_s"], "online_tokens_per_s": co["tokens_per_s"],
                    "online_errors": co["errors"], "inflation": hv.inflation(co, base),
                }
    path = hv.write_results(results, out_dir)
    click.echo(json.dumps({"ceiling_tokens_per_s": ceiling, "summary": results["summary"]}, indent=2))
    click.echo(f"results: {path}; plots: {out_dir}/harvest_fill.png, {out_dir}/harvest_latency_cdf.png", err=True)


COMMANDS = [bench]
