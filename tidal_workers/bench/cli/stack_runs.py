"""`tidal bench` commands that run Tidal itself: the API under load, a fleet of gated workers, fair shares, dispatch
overhead, the queue's claim throughput, the whole stack under faults."""

from __future__ import annotations

import contextlib
import dataclasses
import typing as t
from pathlib import Path

import click

from config import load_settings
from tidal_workers.bench.cli.common import PROFILE_OPTION
from tidal_workers.bench.cli.common import begin
from tidal_workers.bench.cli.common import engine_kind_options
from tidal_workers.bench.cli.common import finish
from tidal_workers.bench.cli.common import log
from tidal_workers.bench.cli.common import out_option

# Per engine kind: the fleet's defaults. Two twins share this machine's 2 cores, so their online rate is what they
# sustain here (the run reports it); the tiny CPU engines keep the CPU history's sizes. The twins' batch is sized
# to finish inside one 600-s day under placement (the finite batch is what tells placement from a split): the
# 1 December run harvested ~600 batch tokens/s with placement, 360k a day, and its 1,200 items (437 output tokens
# each on average) never finished; 650 items are about 80 % of such a day.
FLEET_DEFAULTS = {
    "twin": {"rate": 6.0, "batch_items": 650, "max_inflight": 64, "interval": 10.0},
    "tiny": {"rate": 2.0, "batch_items": 300, "max_inflight": 12, "interval": 5.0},
}


@click.command()
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
@out_option("load")
def load(
    url: str | None, key: str, duration: float, rate: float, uploads: int, upload_lines: int, workers: int, out: str
) -> None:
    """Batch-status polling at a fixed rate plus concurrent uploads: errors, p50/p99 per request kind."""
    from tidal_workers.bench.load import LoadConfig
    from tidal_workers.bench.load import run_load
    from tidal_workers.bench.load import served_api

    out_dir, origin = begin("load", out)
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
    results = {"server": url or f"tidal serve, {workers} gunicorn workers, SQLite", **results}
    finish("load", origin, results, out_dir, results)


@click.command()
@engine_kind_options("twin", "tiny")
@click.option("--engine-urls", help="Comma-separated replicas already running (with --model, --tokenizer).")
@click.option("--model", default="", help="Model name clients send, with --engine-urls.")
@click.option("--tokenizer", default="", help="The served model's tokenizer, with --engine-urls.")
@click.option("--reps", default=3, show_default=True, help="Repetitions (ABBA order of the arms); < 3: no figures.")
@click.option("--period", default=600.0, show_default=True, help="Seconds of one online day (the seed's 600).")
@click.option("--periods", default=1.0, show_default=True, help="Days per arm.")
@click.option("--rate", default=0.0, help="Mean online requests/s per replica (twin 6, tiny 2).")
@click.option("--amplitude", default=0.8, show_default=True, help="Diurnal swing as a fraction of the mean.")
@click.option("--batch-items", default=0, type=int, help="Items of the batch each arm gets (twin 650, tiny 300).")
@click.option("--max-inflight", default=0, type=int, help="Gate ceiling of each worker (twin 64, tiny 12).")
@click.option("--max-num-seqs", default=0, type=int, help="Engine slots (0: the profile's; 16 on the CPU engine).")
@click.option("--interval", default=0.0, help="Seconds per bin of the fill series and r (twin 10, tiny 5).")
@click.option(
    "--arms",
    "batch_arms",
    default="placement,split,pinning",
    show_default=True,
    help="Comma-separated batch arms run beside the baseline (placement, split, pinning).",
)
@out_option("fleet")
def fleet(
    kind: str,
    profile: str,
    engine_urls: str | None,
    model: str,
    tokenizer: str,
    reps: int,
    period: float,
    periods: float,
    rate: float,
    amplitude: float,
    batch_items: int,
    max_inflight: int,
    max_num_seqs: int,
    interval: float,
    batch_arms: str,
    out: str,
) -> None:
    """Placement (a gated worker per replica, one queue) against a static even split of the same batch over the
    same replicas and against pinning it to replica 0, under anti-phase online load, ABBA with intervals."""
    import contextlib
    import dataclasses

    from tidal_workers.bench import fleet as fl
    from tidal_workers.bench import fleet_report
    from tidal_workers.bench.engines import EngineRequest
    from tidal_workers.bench.engines import external
    from tidal_workers.bench.stack import reserved_redis_db
    from tidal_workers.bench.workload import CPU_WORKLOAD
    from tidal_workers.bench.workload import GPU_WORKLOAD

    chosen = tuple(arm for arm in fleet_report.BATCH_ARMS if arm in batch_arms.split(","))
    if not chosen or set(batch_arms.split(",")) - set(chosen):
        raise click.BadParameter(f"choose among {', '.join(fleet_report.BATCH_ARMS)}", param_hint="--arms")
    out_dir, origin = begin("fleet", out)
    settings = load_settings()
    defaults = FLEET_DEFAULTS[kind]
    plan = fl.FleetPlan(
        reps=reps,
        period=period,
        periods=periods,
        online_rate=rate or defaults["rate"],
        amplitude=amplitude,
        batch_items=batch_items or int(defaults["batch_items"]),
        max_inflight=max_inflight or int(defaults["max_inflight"]),
        interval=interval or defaults["interval"],
        workload=GPU_WORKLOAD if kind == "twin" else CPU_WORKLOAD,
        batch_arms=chosen,
    )
    notes = []
    if period < 600:
        notes.append(f"period {period:.0f} s, shorter than the seed's 600 s: not the seed's conditions")
    if reps < 3:
        notes.append(f"{reps} repetition(s): the report refuses every figure (at least 3 are needed)")
    if chosen != fleet_report.BATCH_ARMS:
        notes.append(f"arms run beside the baseline: {', '.join(chosen)} (not every arm)")
    for note in notes:
        click.echo(f"note: {note}", err=True)
    expected = plan.expected_s(engine_start_s=0.0 if engine_urls else 150.0)
    arms_text = f"{reps} reps x {1 + len(chosen)} arms, ABBA"
    click.echo(f"expected duration: about {expected / 60:.0f} min ({arms_text})", err=True)
    with contextlib.ExitStack() as running:
        if engine_urls:
            slots = max_num_seqs or 16
            engines = [external(u, model, tokenizer, slots, 2048, None) for u in engine_urls.split(",")]
        else:
            request = EngineRequest(kind, profile if kind == "twin" else None, max_num_seqs)
            replicas, engines = fl.start_replicas(request, 2, settings, out_dir)
            running.enter_context(replicas)
        split_db = running.enter_context(reserved_redis_db(settings))
        arms = fl.Fleet(plan, engines, settings, out_dir, split_db).run(log)
    results = {
        "notes": notes,
        "plan": dataclasses.asdict(plan),
        "engines": [e.provenance() for e in engines],
        "summary": fleet_report.intervals(arms),
        "arms": arms,
    }
    fl.plot(arms, out_dir / "fleet.png")
    table = fleet_report.table(arms, len(engines))
    finish(
        "fleet", origin, results, out_dir, "\n".join([*(f"note: {n}" for n in notes), table]), [out_dir / "fleet.png"]
    )


@click.command()
@click.option("--weights", default="1:1,3:1,1:3", show_default=True, help="heavy:light weight pairs to run.")
@click.option("--reps", default=5, show_default=True, help="Runs per weight pair (at least 2).")
@click.option("--nodes", default=4, show_default=True, help="Claiming nodes (threads, one connection each).")
@click.option("--inflight", default=8, show_default=True, help="Items each node keeps leased.")
@click.option("--items", default=1500, show_default=True, help="Items per tenant (heavy: in 100 batches).")
@click.option("--service-ms", default=4.0, show_default=True, help="Mean simulated engine time per item.")
@out_option("fairness")
def fairness(weights: str, reps: int, nodes: int, inflight: int, items: int, service_ms: float, out: str) -> None:
    """Two tenants' shares of claims against their weights, under concurrent nodes (scratch Redis DB 14)."""
    from tidal_workers.bench import fairness as fair
    from tidal_workers.bench.stack import BENCH_REDIS_DB

    if reps < 2:
        raise click.BadParameter("at least 2, for an interval", param_hint="--reps")
    out_dir, origin = begin("fairness", out)
    settings = load_settings()
    redis_url = settings.redis_url.rsplit("/", 1)[0] + f"/{BENCH_REDIS_DB}"
    pairs = [tuple(float(w) for w in pair.split(":")) for pair in weights.split(",")]
    configs = [fair.FairnessConfig(redis_url, (h, lt), nodes, inflight, 100, items, service_ms) for h, lt in pairs]
    results = {"setup": fair.config_summary(configs[0]), "pairs": [fair.measure(cfg, reps) for cfg in configs]}
    headline = "\n".join(
        f"weights {pair['weights']['heavy']:g}:{pair['weights']['light']:g}  heavy share / its weight's: "
        f"{pair['share_ratio_mean']:.4f} (95 % {pair['share_ratio_95'][0]:.4f}-{pair['share_ratio_95'][1]:.4f})"
        for pair in results["pairs"]
    )
    finish("fairness", origin, results, out_dir, headline)


@click.command()
@click.option(
    "--scenarios",
    default="250:64,30:8",
    show_default=True,
    help="Comma-separated engine-ms:max_tokens pairs: the fixed engine's time per request and the items' max_tokens.",
)
@click.option("--target", default=8, show_default=True, help="The gate's (fixed) target: engine slots to keep busy.")
@click.option("--reps", default=3, show_default=True, help="Repetitions per scenario (ABBA order).")
@click.option("--window", default=15.0, show_default=True, help="Seconds measured per run.")
@click.option(
    "--engine",
    type=click.Choice(["fixed", "twin"]),
    default="fixed",
    show_default=True,
    help="fixed: answers after the scenario's time; twin: the GPU-timed twin (the scenario's time sizes the backlog).",
)
@PROFILE_OPTION
@click.option(
    "--prefetch",
    type=click.IntRange(0, 64),
    default=None,
    help="The worker's TIDAL_DISPATCH_PREFETCH (items claimed beyond the target); default: the setting's.",
)
@out_option("dispatch")
def dispatch(
    scenarios: str, target: int, reps: int, window: float, engine: str, profile: str, prefetch: int | None, out: str
) -> None:
    """Batch requests at the engine against the gate's target, batch tokens/s against a closed loop holding as
    many requests, and the dispatch-overhead percentiles."""
    import tempfile

    from tidal_workers.bench import dispatch as dp

    cfg = dp.DispatchConfig(
        scenarios=tuple(dp.Scenario(float(ms), int(mt)) for ms, mt in (p.split(":") for p in scenarios.split(","))),
        target=target,
        reps=reps,
        window=window,
        engine=engine,
        profile=profile,
        prefetch=prefetch,
    )
    out_dir, origin = begin("dispatch", out)
    results: dict = {"config": dataclasses.asdict(cfg)}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-dispatch-") as home:
        results["scenarios"] = dp.run(cfg, load_settings(), Path(home))
    headline = [{"scenario": r["scenario"], **r["summary"]} for r in results["scenarios"]]
    finish("dispatch", origin, results, out_dir, headline)


def _dispatch_results(arm: str, which: str) -> t.Callable[[t.Callable], t.Callable]:
    return click.option(
        f"--{arm}",
        multiple=True,
        required=True,
        type=click.Path(exists=True, dir_okay=False),
        help=f"A dispatch.json of the code {which}.",
    )


@click.command("dispatch-compare")
@_dispatch_results("old", "before")
@_dispatch_results("new", "after")
@out_option("dispatch-compare")
def dispatch_compare(old: tuple[str, ...], new: tuple[str, ...], out: str) -> None:
    """New ÷ old of the dispatch medians (POST answered → lease released; token freed → next POST), from whole
    `tidal bench dispatch` commands run in ABBA order against two versions of the code, with 95 % intervals."""
    import json

    from tidal_workers.bench import dispatch as dp

    out_dir, origin = begin("dispatch-compare", out)
    docs = {arm: [json.loads(Path(p).read_text()) for p in paths] for arm, paths in (("old", old), ("new", new))}
    results = {
        "inputs": {
            arm: [
                {"path": p, "git_commit": d.get("git_commit"), "started_utc": d.get("started_utc")}
                for p, d in zip(paths, docs[arm])
            ]
            for arm, paths in (("old", old), ("new", new))
        },
        "comparison": dp.compare(docs["old"], docs["new"]),
    }
    headline = {name: {f: v["verdict"] for f, v in figs.items()} for name, figs in results["comparison"].items()}
    finish("dispatch_compare", origin, results, out_dir, headline)


@click.command()
@click.option("--items", default=200_000, show_default=True, help="Items queued for the claim-throughput runs.")
@out_option("queue")
def queue(items: int, out: str) -> None:
    """Claim throughput from the Redis sorted sets and re-score cost against batch size (scratch Redis DB)."""
    from tidal_workers.bench import queue as bench_queue

    out_dir, origin = begin("queue", out)
    results = bench_queue.run(load_settings().redis_url, items)
    finish("queue", origin, results, out_dir, results)


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


@click.command()
@click.option("--minutes", default=30.0, show_default=True, help="Length of the chaos window (faults and load).")
@click.option("--seed", default=None, type=int, help="Seed of the fault schedule and the load; default: random.")
@engine_kind_options("twin", "tiny")
@click.option("--max-num-seqs", default=8, show_default=True, help="Each engine's slots (two share this machine).")
@click.option("--interval", default="30:90", show_default=True, help="Seconds between faults, MIN:MAX.")
@click.option("--engine-down", default="10:240", show_default=True, help="Seconds a killed engine stays down.")
@click.option("--stall", default="5:30", show_default=True, help="Seconds Redis stays paused (SIGSTOP).")
@click.option("--tenants", default=3, show_default=True)
@click.option("--batch-every", default=20.0, show_default=True, help="Each tenant submits a batch this often (s).")
@click.option("--online-rate", default=0.2, show_default=True, help="Online requests/s to each engine.")
@click.option("--drain-minutes", default=10.0, show_default=True, help="Time every batch has to finish afterwards.")
@out_option("chaos")
def chaos(
    minutes: float,
    seed: int | None,
    kind: str,
    profile: str,
    max_num_seqs: int,
    interval: str,
    engine_down: str,
    stall: str,
    tenants: int,
    batch_every: float,
    online_rate: float,
    drain_minutes: float,
    out: str,
) -> None:
    """The whole stack (private Redis and PostgreSQL, API, two GPU nodes, ops worker, beat) under random faults; then
    every batch must be completed with every input line exactly once and no error line. Exit status 1 if not."""
    import secrets
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
        engine=kind,
        profile=profile if kind == "twin" else "",
        max_num_seqs=max_num_seqs,
    )
    out_dir, origin = begin("chaos", out)
    click.echo(f"chaos: seed {cfg.seed}, {len(ch.schedule(cfg))} faults in {minutes:g} min; logs {out_dir}", err=True)
    work = Path(tempfile.mkdtemp(prefix="tidal-chaos-", dir=out_dir))
    report = ch.run(cfg, load_settings(), work)
    results = {"logs": str(work), **report}
    finish("chaos", origin, results, out_dir, {k: v for k, v in results.items() if k != "batches"})
    if not results["ok"]:
        raise SystemExit(1)
