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
from tidal_api.cli.engine import SHAPE


@click.group()
def bench() -> None:
    """Measurements of Tidal; each prints JSON and writes plots under --out."""


def machine() -> str:
    import os

    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"


def provenance(command: str) -> dict:
    """What docs/benchmarks.md records beside every number: the command, the machine and the date."""
    return {"command": f"tidal bench {command}", "machine": machine(), "date": dt.date.today().isoformat()}


def output_dir(out: str) -> Path:
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _engine(
    url: str | None,
    plugin: bool,
    log_dir: Path,
    max_num_seqs: int,
    settings=None,
    shape: str = "tiny",
    kv_bytes: str = "64M",
):
    """The engine to measure: a URL as given, or a local one of ``shape`` started (and stopped) here."""
    if url:
        yield url
        return
    from tidal_engine.serve import start_tiny

    engine = start_tiny(
        settings or load_settings(),
        log_path=log_dir / f"engine-{'B' if plugin else 'A'}.log",
        tidal_scheduler=plugin,
        max_num_seqs=max_num_seqs,
        shape=shape,
        kv_cache_bytes=kv_bytes,
    )
    try:
        yield engine.url
    finally:
        engine.stop()


@bench.command()
@click.option("--engine-url", help="Engine for technique A (stock scheduler). Default: start the tiny local engine.")
@click.option("--engine-b-url", help="Engine running TidalScheduler, for technique B. Default: start the tiny one.")
@click.option("--plugin-metrics-url", help="TidalScheduler's /metrics, with --engine-b-url (read for R², cap, fill).")
@click.option("--techniques", default="A,B", show_default=True, help="Which co-served runs to make.")
@click.option("--model", default="", help="Model name in the requests; default: the local engine's shape.")
@SHAPE
@click.option("--duration", default=30.0, show_default=True, help="Seconds per phase.")
@click.option("--rate", default=4.0, show_default=True, help="Online requests/s (the mean, for diurnal).")
@click.option("--trace", type=click.Choice(["flat", "diurnal", "both"]), default="both", show_default=True)
@click.option("--online-max-tokens", default=48, show_default=True)
@click.option("--batch-max-tokens", default=128, show_default=True)
@click.option(
    "--batch-prompt-bytes",
    default=0,
    type=int,
    help="Length of each batch prompt in bytes (= tokens on the local models); default about 420.",
)
@click.option(
    "--max-inflight",
    default=12,
    show_default=True,
    help="Gate ceiling of the harvesting worker, and the ceiling run's concurrency.",
)
@click.option("--max-num-seqs", default=16, show_default=True, help="Slots of a locally started engine.")
@click.option("--budget-tokens", default=2048, show_default=True, help="The engine's max_num_batched_tokens.")
@click.option("--kv-bytes", default="64M", show_default=True, help="KV pool of a locally started engine.")
@click.option(
    "--b-gate",
    type=click.Choice(["aimd", "fixed"]),
    default="aimd",
    show_default=True,
    help="B's worker gate: A's AIMD gate, or fixed at --max-inflight (KV left to the plugin's guardband; "
    "give the engine slots to spare with --max-num-seqs).",
)
@click.option(
    "--a-inflight",
    default="",
    help="Comma-separated gate ceilings for A's co-served runs (default: --max-inflight only). A can "
    "protect online latency only by holding fewer items in flight: a sweep finds the A that matches "
    "B's online latency, for a harvest comparison at equal latency.",
)
@click.option("--out", type=click.Path(file_okay=False), default="bench-out/harvest", show_default=True)
def harvest(
    engine_url,
    engine_b_url,
    plugin_metrics_url,
    techniques,
    model,
    shape,
    duration,
    rate,
    trace,
    online_max_tokens,
    batch_max_tokens,
    batch_prompt_bytes,
    max_inflight,
    max_num_seqs,
    budget_tokens,
    kv_bytes,
    b_gate,
    a_inflight,
    out,
) -> None:
    """Offline ceiling, online baseline and co-served harvest, technique A against B.

    A: the worker's AIMD gate + the stock scheduler. B: TidalScheduler in the engine deciding the tokens of
    each step and guarding KV, behind either the same AIMD gate (--b-gate aimd: it still keeps batch below
    the engine's slots, which the plugin cannot free for a waiting online request) or a fixed in-flight
    limit (--b-gate fixed). Each technique gets its own engine and its own online baseline on it; the
    ceiling is measured once, on the first engine.
    """
    from tidal_engine.serve import free_port
    from tidal_workers.bench import engine_stats
    from tidal_workers.bench import harvest as hv
    from tidal_workers.bench.stack import TidalStack

    out_dir = output_dir(out)
    settings = load_settings()
    traces = ["flat", "diurnal"] if trace == "both" else [trace]
    model = model or shape
    results: dict = {
        **provenance("harvest"),
        "params": {
            "duration": duration,
            "rate": rate,
            "traces": traces,
            "max_inflight": max_inflight,
            "shape": shape,
            "model": model,
            "sched_tbt_slo_ms": settings.sched_tbt_slo_ms,
            "kv_bytes": kv_bytes,
            "b_gate": b_gate,
            "a_inflight": a_inflight,
            "max_num_seqs": max_num_seqs,
            "online_max_tokens": online_max_tokens,
            "batch_max_tokens": batch_max_tokens,
            "batch_prompt_bytes": batch_prompt_bytes,
        },
        "runs": {},
        "summary": {},
    }
    a_ceilings = [int(x) for x in a_inflight.split(",") if x.strip()] or [max_inflight]
    ceiling = None
    for technique in [x.strip() for x in techniques.split(",") if x.strip()]:
        plugin = technique == "B"
        url = engine_b_url if plugin else engine_url
        metrics_url = plugin_metrics_url if plugin and url else None
        engine_settings = settings
        if plugin and not url:
            port = free_port()
            engine_settings = settings.replace(sched_metrics_port=port)
            metrics_url = f"http://127.0.0.1:{port}/metrics"
        started = dt.datetime.now()
        with _engine(url, plugin, out_dir, max_num_seqs, engine_settings, shape, kv_bytes) as live_url:
            results.setdefault("engine_start_s", {})[technique] = (dt.datetime.now() - started).total_seconds()
            base_cfg = hv.HarvestConfig(
                engine_url=live_url,
                model=model,
                duration=duration,
                online_rate=rate,
                online_max_tokens=online_max_tokens,
                batch_max_tokens=batch_max_tokens,
                ceiling_concurrency=max_inflight,
                budget_tokens=budget_tokens,
                plugin_metrics_url=metrics_url,
            )
            if batch_prompt_bytes:
                base_cfg = dataclasses.replace(base_cfg, batch_prompt=hv.report_prompt(batch_prompt_bytes))
            click.echo(f"[{technique}] warm-up (unmeasured) ...", err=True)
            hv.warm_up(base_cfg)
            if ceiling is None:
                click.echo(f"[{technique}] offline ceiling ...", err=True)
                results["runs"]["ceiling"] = hv.measure_ceiling(base_cfg)
                ceiling = results["runs"]["ceiling"]["batch_tokens_per_s"]
            for tr in traces:
                cfg = dataclasses.replace(base_cfg, trace=tr, diurnal_period=duration)
                click.echo(f"[{technique}] online-only baseline, {tr} ...", err=True)
                base = results["runs"][f"baseline-{tr}-{technique}"] = hv.measure_online(cfg)
                gate_mode = b_gate if plugin else "aimd"
                for gate_ceiling in [max_inflight] if plugin else a_ceilings:
                    label = technique if gate_ceiling == max_inflight else f"{technique}@{gate_ceiling}"
                    click.echo(f"[{label}] co-served, {tr} ...", err=True)
                    with TidalStack(
                        settings,
                        live_url,
                        out_dir / f"stack-{label}-{tr}",
                        gate_mode=gate_mode,
                        max_inflight=gate_ceiling,
                    ) as stack:
                        co = results["runs"][f"coserved-{tr}-{label}"] = hv.run_coserved(cfg, stack)
                    engine_stats.wait_idle(live_url)
                    results["summary"][f"{tr}-{label}"] = hv.summary(co, base, ceiling)
    path = hv.write_results(results, out_dir)
    click.echo(json.dumps({"ceiling_tokens_per_s": ceiling, "summary": results["summary"]}, indent=2))
    click.echo(f"results: {path}; plots: {out_dir}/harvest_fill.png, {out_dir}/harvest_latency_cdf.png", err=True)


@bench.command()
@click.option("--engine-url", help="Engine to measure. Default: start the tiny local engine (stock scheduler).")
@click.option("--model", default="tiny", show_default=True)
@click.option("--duration", default=40.0, show_default=True, help="Seconds of batch trickle, burst included.")
@click.option("--burst-at", default=12.0, show_default=True, help="Seconds into the run when the online burst fires.")
@click.option("--burst-requests", default=32, show_default=True, help="Online requests in the burst (priority 0).")
@click.option("--max-num-seqs", default=8, show_default=True, help="Slots of a locally started engine.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-out/gate", show_default=True)
def gate(engine_url, model, duration, burst_at, burst_requests, max_num_seqs, out) -> None:
    """The AIMD gate on a real engine's /metrics while an online burst comes and goes."""
    from tidal_workers.bench import gate_trace

    out_dir = output_dir(out)
    settings = load_settings()
    with _engine(engine_url, False, out_dir, max_num_seqs) as live_url:
        cfg = gate_trace.GateTraceConfig(
            engine_url=live_url, model=model, duration=duration, burst_at=burst_at, burst_requests=burst_requests
        )
        trace = gate_trace.run(cfg, settings)
    path = gate_trace.write(trace, out_dir, provenance("gate"))
    click.echo(json.dumps(trace.summary(), indent=2))
    click.echo(f"results: {path}; plot: {out_dir}/gate_burst.png", err=True)


@bench.command()
@click.option("--url", help="API to load. Default: start a private `tidal serve` (gunicorn, temp TIDAL_HOME).")
@click.option("--key", default="tidal-dev-key", show_default=True, help="API key, with --url.")
@click.option("--duration", default=60.0, show_default=True, help="Seconds of load.")
@click.option("--rate", default=200.0, show_default=True, help="GET /v1/batches/{id} per second.")
@click.option(
    "--uploads",
    default=2,
    show_default=True,
    help="Concurrent uploaders; each uploads a file and creates a batch from it once a second.",
)
@click.option("--upload-lines", default=200, show_default=True, help="Requests per uploaded file.")
@click.option("--workers", default=2, show_default=True, help="gunicorn workers of the started server.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-out/load", show_default=True)
def load(url, key, duration, rate, uploads, upload_lines, workers, out) -> None:
    """Batch-status polling at a fixed rate plus concurrent uploads: errors, p50/p99 per request kind."""
    from tidal_workers.bench.load import LoadConfig
    from tidal_workers.bench.load import run_load
    from tidal_workers.bench.load import served_api

    out_dir = output_dir(out)
    server = (
        contextlib.nullcontext((url, key, ""))
        if url
        else served_api(load_settings().redis_url, workers, log_dir=out_dir)
    )
    with server as (live_url, live_key, metrics_url):
        results = run_load(
            LoadConfig(
                url=live_url,
                key=live_key,
                duration=duration,
                rate=rate,
                uploads=uploads,
                upload_lines=upload_lines,
                metrics_url=metrics_url,
            )
        )
    results = {**provenance("load"), "server": url or f"tidal serve, {workers} gunicorn workers, SQLite", **results}
    path = out_dir / "load.json"
    path.write_text(json.dumps(results, indent=2))
    click.echo(json.dumps(results, indent=2))
    click.echo(f"results: {path}", err=True)


@bench.command()
@click.option("--engine-urls", help="Comma-separated replicas to use. Default: start two tiny engines, one per core.")
@click.option("--model", default="tiny", show_default=True)
@click.option("--period", default=120.0, show_default=True, help="Seconds of one online day (the seed used 600).")
@click.option("--periods", default=2.0, show_default=True, help="Days per run; each mode runs this long.")
@click.option("--rate", default=4.0, show_default=True, help="Mean online requests/s per replica.")
@click.option("--amplitude", default=0.8, show_default=True, help="Diurnal swing as a fraction of the mean.")
@click.option("--max-inflight", default=12, show_default=True, help="Gate ceiling of each worker.")
@click.option("--max-num-seqs", default=16, show_default=True, help="Slots of each locally started engine.")
@click.option("--interval", default=5.0, show_default=True, help="Seconds per bin of the fill series.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-out/fleet", show_default=True)
def fleet(engine_urls, model, period, periods, rate, amplitude, max_inflight, max_num_seqs, interval, out) -> None:
    """Batch work placed by per-replica gates against pinned to replica 0, under anti-phase online load."""
    import os

    from tidal_engine.tiny import build_tiny
    from tidal_workers.bench import fleet as fl

    out_dir = output_dir(out)
    settings = load_settings()
    engines = [] if engine_urls else fl.start_replicas(build_tiny(settings.home), 2, out_dir, max_num_seqs)
    urls = engine_urls.split(",") if engine_urls else [e.url for e in engines]
    cfg = fl.FleetConfig(
        engine_urls=urls,
        model=model,
        period=period,
        periods=periods,
        online_rate=rate,
        amplitude=amplitude,
        max_inflight=max_inflight,
        interval=interval,
    )
    results: dict = {
        **provenance("fleet"),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_average": {"start": os.getloadavg()},
        "params": {k: v for k, v in dataclasses.asdict(cfg).items() if not k.endswith("prompt")},
        "runs": {},
    }
    try:
        for mode in ("placement", "pinning"):
            click.echo(f"{mode}: {cfg.duration:.0f} s ...", err=True)
            results["runs"][mode] = fl.run_mode(cfg, settings, mode, out_dir / f"stack-{mode}")
            results["load_average"][f"after_{mode}"] = os.getloadavg()
    finally:
        for engine in engines:
            engine.stop()
    results["summary"] = fl.summary(results["runs"]["placement"], results["runs"]["pinning"])
    path = fl.write(results, out_dir)
    click.echo(json.dumps({"load_average": results["load_average"], "summary": results["summary"]}, indent=2))
    click.echo(f"results: {path}; plot: {out_dir}/fleet.png", err=True)


@bench.command()
@click.option("--engine-url", help="Engine to measure. Default: start the tiny local engine with --kv-cache-bytes.")
@click.option("--model", default="tiny", show_default=True)
@click.option("--items", default=96, show_default=True, help="Requests in the batch.")
@click.option("--groups", default=12, show_default=True, help="Distinct shared prompt prefixes.")
@click.option("--prefix-chars", default=400, show_default=True, help="Shared prefix length (tokens on the tiny model).")
@click.option("--inflight", default=4, show_default=True, help="Requests outstanding at once, in either order.")
@click.option(
    "--kv-cache-bytes",
    default="3M",
    show_default=True,
    help="KV pool of a locally started engine (3M: about 3,000 tokens, fewer than all the prefixes).",
)
@click.option("--out", type=click.Path(file_okay=False), default="bench-out/prefix", show_default=True)
def prefix(engine_url, model, items, groups, prefix_chars, inflight, kv_cache_bytes, out) -> None:
    """vLLM prefix-cache hit rate of Tidal's claim order (prefix-sorted ordinals) against shuffled order."""
    from tidal_engine.serve import EngineOptions
    from tidal_engine.serve import start_engine
    from tidal_engine.tiny import build_tiny
    from tidal_workers.bench import prefix as px

    out_dir = output_dir(out)
    engine = None
    if not engine_url:
        options = EngineOptions(
            model=str(build_tiny(load_settings().home)),
            served_model_name=model,
            kv_cache_bytes=kv_cache_bytes,
            max_model_len=2048,
        )
        engine = start_engine(options, log_path=out_dir / "engine.log")
    try:
        results = px.run(
            px.PrefixConfig(
                engine_url=engine_url or (engine.url if engine else ""),
                model=model,
                items=items,
                groups=groups,
                prefix_chars=prefix_chars,
                inflight=inflight,
            )
        )
    finally:
        if engine is not None:
            engine.stop()
    results = {**provenance("prefix"), "engine": engine_url or f"tiny vLLM-CPU, KV pool {kv_cache_bytes}", **results}
    path = out_dir / "prefix.json"
    path.write_text(json.dumps(results, indent=2))
    click.echo(json.dumps(results, indent=2))
    click.echo(f"results: {path}", err=True)


@bench.command()
@click.option("--items", default=200_000, show_default=True, help="Items queued for the claim-throughput runs.")
def queue(items) -> None:
    """Claim throughput from the Redis sorted sets and re-score cost against batch size (scratch Redis DB)."""
    from tidal_workers.bench_queue import main

    main(items)


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


@bench.command()
@click.option("--minutes", default=30.0, show_default=True, help="Length of the chaos window (faults and load).")
@click.option("--seed", default=None, type=int, help="Seed of the fault schedule and the load; default: random.")
@click.option("--engine", "engine_kind", type=click.Choice(["tiny"]), default="tiny", show_default=True)
@click.option("--interval", default="30:90", show_default=True, help="Seconds between faults, MIN:MAX.")
@click.option("--engine-down", default="10:240", show_default=True, help="Seconds a killed engine stays down.")
@click.option("--stall", default="5:30", show_default=True, help="Seconds Redis stays paused (SIGSTOP).")
@click.option("--tenants", default=3, show_default=True)
@click.option("--batch-every", default=20.0, show_default=True, help="Each tenant submits a batch this often (s).")
@click.option("--online-rate", default=0.2, show_default=True, help="Online requests/s to each engine.")
@click.option("--drain-minutes", default=10.0, show_default=True, help="Time every batch has to finish afterwards.")
@click.option("--out", default="bench-out/chaos", show_default=True)
def chaos(
    minutes, seed, engine_kind, interval, engine_down, stall, tenants, batch_every, online_rate, drain_minutes, out
) -> None:
    """The whole stack (private Redis and PostgreSQL, API, two GPU nodes, ops worker, beat) under random faults; then
    every batch must be completed with every input line exactly once and no error line. Exit status 1 if not."""
    import secrets
    import subprocess
    import sys
    import tempfile

    from tidal_workers.bench import chaos as ch

    cfg = ch.ChaosConfig(
        minutes=minutes,
        seed=secrets.randbelow(1_000_000) if seed is None else seed,
        interval=_span(interval),
        engine_down=_span(engine_down),
        stall=_span(stall),
        tenants=tenants,
        batch_every=batch_every,
        online_rate=online_rate,
        drain_minutes=drain_minutes,
        engine=engine_kind,
    )
    out_dir = output_dir(out)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    click.echo(f"chaos: seed {cfg.seed}, {len(ch.schedule(cfg))} faults in {minutes:g} min; logs {out_dir}", err=True)
    work = Path(tempfile.mkdtemp(prefix="tidal-chaos-", dir=out_dir))
    report = ch.run(cfg, load_settings(), work)
    results = {
        **provenance("chaos"),
        "argv": sys.argv,
        "commit": commit or "unknown",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "logs": str(work),
        **report,
    }
    path = out_dir / "chaos.json"
    path.write_text(json.dumps(results, indent=2))
    click.echo(json.dumps({k: v for k, v in results.items() if k != "batches"}, indent=2))
    click.echo(f"results: {path}", err=True)
    if not results["ok"]:
        raise SystemExit(1)


COMMANDS = [bench]
