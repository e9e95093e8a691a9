"""`tidal bench` commands that measure an engine: harvest beside online traffic, the gate's trace, the prefix cache,
the compute bound, the timed twin and its calibration, the KV connectors, disaggregated serving."""

from __future__ import annotations

import dataclasses
import json
import typing as t
from pathlib import Path

import click

from config import load_settings
from tidal_workers.bench.cli.common import MODEL_OPTION
from tidal_workers.bench.cli.common import PROFILE_OPTION
from tidal_workers.bench.cli.common import begin
from tidal_workers.bench.cli.common import deployment_ceiling
from tidal_workers.bench.cli.common import engine_kind_options
from tidal_workers.bench.cli.common import engine_url_option
from tidal_workers.bench.cli.common import finish
from tidal_workers.bench.cli.common import numbers
from tidal_workers.bench.cli.common import out_option
from tidal_workers.bench.cli.common import tiny_engine

if t.TYPE_CHECKING:
    from tidal_engine.step_time import Profile
    from tidal_workers.bench.oracle import RequestClass

# Per engine kind: what a run measures unless told otherwise. The twin reproduces the seed's experiment; the CPU
# engine's values are its history's (a 2-core machine answers a few requests a second).
HARVEST_DEFAULTS = {
    "twin": {"flat_rate": 20.0, "diurnal_rate": 12.1, "samples": 1000},
    "cpu": {"flat_rate": 4.0, "diurnal_rate": 4.0, "samples": 120, "max_inflight": 12},
}


@click.command()
@engine_kind_options("twin", "tiny", "dense")
@click.option("--engine-url", help="An engine already running for outside (a GPU host) instead of starting one.")
@click.option("--inside-engine-url", help="The same for inside: an engine running TidalScheduler.")
@click.option("--plugin-metrics-url", help="TidalScheduler's /metrics, with --inside-engine-url.")
@click.option("--model", default="", help="Model name clients send, with --engine-url.")
@click.option("--tokenizer", default="", help="The served model's tokenizer (directory or name), with --engine-url.")
@click.option(
    "--techniques",
    default="outside,inside",
    show_default=True,
    help="Which techniques to run: outside (the gate, stock scheduler), inside (the gate and TidalScheduler).",
)
@click.option("--trace", type=click.Choice(["flat", "diurnal", "both"]), default="both", show_default=True)
@click.option("--reps", default=3, show_default=True, help="Repetitions per figure (ABBA order); < 3: no figures.")
@click.option("--samples", default=0, type=int, help="Online requests per phase (twin 1000, CPU 120).")
@click.option("--flat-rate", default=0.0, help="Online requests/s of the flat trace (twin 20, CPU 4).")
@click.option("--diurnal-rate", default=0.0, help="Mean online requests/s of the diurnal trace (twin 12.1, CPU 4).")
@click.option("--amplitude", default=0.8, show_default=True, help="Diurnal swing as a fraction of the mean.")
@click.option("--ceiling-seconds", default=10.0, show_default=True, help="Measured window of each ceiling.")
@click.option("--settle-seconds", default=3.0, show_default=True, help="Backlog flowing before a co-served window.")
@click.option(
    "--max-inflight",
    default=0,
    type=int,
    help="The harvesting worker's gate ceiling (twin: the deployment default from the profile's slots and KV; CPU 12).",
)
@click.option("--max-num-seqs", default=0, type=int, help="Engine slots (0: the profile's; 16 on the CPU engine).")
@click.option(
    "--budget-tokens", default=2048, show_default=True, help="τ of a CPU engine (the twin's is its profile's)."
)
@click.option("--kv-bytes", default="64M", show_default=True, help="KV pool of a CPU engine started here.")
@click.option(
    "--inside-gate",
    type=click.Choice(["aimd", "fixed"]),
    default="aimd",
    show_default=True,
    help="The gate in front of TidalScheduler: AIMD as outside, or fixed at --max-inflight (KV left to its guardband).",
)
@out_option("harvest")
def harvest(
    kind: str,
    profile: str,
    engine_url: str | None,
    inside_engine_url: str | None,
    plugin_metrics_url: str | None,
    model: str,
    tokenizer: str,
    techniques: str,
    trace: str,
    reps: int,
    samples: int,
    flat_rate: float,
    diurnal_rate: float,
    amplitude: float,
    ceiling_seconds: float,
    settle_seconds: float,
    max_inflight: int,
    max_num_seqs: int,
    budget_tokens: int,
    kv_bytes: str,
    inside_gate: str,
    out: str,
) -> None:
    """Ceiling, online baseline and co-served harvest, Tidal outside against inside the engine, in ABBA order.

    outside: the worker's AIMD gate + the stock scheduler. inside: TidalScheduler in the engine deciding each step's
    tokens, behind the same gate (or a fixed in-flight limit, --inside-gate fixed). Each technique has its own
    engine, its own ceiling (every slot full) and its own online baseline, every repetition. The windows are not
    judged steady: `tidal bench frontier` supersedes these figures.
    """
    from tidal_workers.bench import harvest as hv
    from tidal_workers.bench import harvest_report
    from tidal_workers.bench.engines import BenchEngine
    from tidal_workers.bench.engines import EngineRequest
    from tidal_workers.bench.engines import external
    from tidal_workers.bench.workload import CPU_WORKLOAD
    from tidal_workers.bench.workload import GPU_WORKLOAD

    out_dir, origin = begin("harvest", out)
    defaults = HARVEST_DEFAULTS["twin" if kind == "twin" else "cpu"]
    plan = hv.HarvestPlan(
        techniques=tuple(x.strip() for x in techniques.split(",") if x.strip()),
        traces=("flat", "diurnal") if trace == "both" else (trace,),
        reps=reps,
        flat_rate=flat_rate or defaults["flat_rate"],
        diurnal_rate=diurnal_rate or defaults["diurnal_rate"],
        amplitude=amplitude,
        samples=samples or int(defaults["samples"]),
        ceiling_s=ceiling_seconds,
        settle_s=settle_seconds,
        max_inflight=max_inflight
        or (deployment_ceiling(profile, max_num_seqs) if kind == "twin" else int(defaults["max_inflight"])),
        inside_gate=inside_gate,
        workload=GPU_WORKLOAD if kind == "twin" else CPU_WORKLOAD,
    )
    request = EngineRequest(
        kind, profile if kind == "twin" else None, max_num_seqs, kv_bytes=kv_bytes, budget_tokens=budget_tokens
    )
    urls = {"outside": engine_url, "inside": inside_engine_url}
    if unknown := set(plan.techniques) - set(urls):
        raise click.BadParameter(
            f"unknown technique(s) {', '.join(sorted(unknown))}: outside, inside", param_hint="--techniques"
        )
    engines: dict[str, EngineRequest | BenchEngine] = {}
    for technique in plan.techniques:
        url = urls[technique]
        metrics_url = plugin_metrics_url if technique == "inside" else None
        engines[technique] = (
            external(url, model, tokenizer, max_num_seqs, budget_tokens, metrics_url) if url else request
        )
    expected = plan.expected_s(engine_start_s=60.0)
    click.echo(f"expected duration: about {expected / 60:.0f} min ({plan.reps} reps, ABBA)", err=True)
    results = hv.run_harvest(plan, engines, load_settings(), out_dir, lambda line: click.echo(line, err=True))
    files = harvest_report.plot(results["phases"], out_dir)
    # Compact: the raw records (every chunk of ~12,000 online requests) would triple in size indented.
    finish("harvest", origin, results, out_dir, harvest_report.table(results["phases"]), files, indent=None)


@click.command()
@engine_url_option("the tiny CPU engine (stock scheduler)")
@MODEL_OPTION
@click.option("--duration", default=40.0, show_default=True, help="Seconds of batch trickle, burst included.")
@click.option("--burst-at", default=12.0, show_default=True, help="Seconds into the run when the online burst fires.")
@click.option("--burst-requests", default=32, show_default=True, help="Online requests in the burst (priority 0).")
@click.option("--max-num-seqs", default=8, show_default=True, help="Slots of a locally started engine.")
@out_option("gate")
def gate(
    engine_url: str | None,
    model: str,
    duration: float,
    burst_at: float,
    burst_requests: int,
    max_num_seqs: int,
    out: str,
) -> None:
    """The AIMD gate on a real engine's /metrics while an online burst comes and goes."""
    from tidal_workers.bench import gate_trace

    out_dir, origin = begin("gate", out)
    with tiny_engine(engine_url, out_dir, max_num_seqs) as live_url:
        cfg = gate_trace.GateTraceConfig(
            engine_url=live_url, model=model, duration=duration, burst_at=burst_at, burst_requests=burst_requests
        )
        trace = gate_trace.run(cfg, load_settings())
    gate_trace.plot(trace, out_dir / "gate_burst.png")
    finish("gate", origin, gate_trace.results(trace), out_dir, trace.summary(), [out_dir / "gate_burst.png"])


@click.command()
@engine_url_option("the tiny CPU engine with --kv-cache-bytes")
@MODEL_OPTION
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
@out_option("prefix")
def prefix(
    engine_url: str | None,
    model: str,
    items: int,
    groups: int,
    prefix_chars: int,
    inflight: int,
    kv_cache_bytes: str,
    out: str,
) -> None:
    """vLLM prefix-cache hit rate of Tidal's claim order (prefix-sorted ordinals) against shuffled order."""
    from tidal_engine.serve import EngineOptions
    from tidal_engine.serve import start_engine
    from tidal_engine.tiny import build_tiny
    from tidal_workers.bench import prefix as px

    out_dir, origin = begin("prefix", out)
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
    results = {"engine": engine_url or f"tiny vLLM-CPU, KV pool {kv_cache_bytes}", **results}
    finish("prefix", origin, results, out_dir, results)


@click.command()
@PROFILE_OPTION
@click.option("--online-rate", default="8", show_default=True, help="Comma-separated online requests/s.")
@click.option(
    "--ceiling", type=float, default=0.0, help="A measured ceiling (batch tokens/s): state the bound as a share."
)
@click.option(
    "--alpha",
    default="",
    help="Comma-separated step inflations α (inf: no latency budget): H*(α) for each (tidal_workers/bench/oracle.py).",
)
@click.option(
    "--knee-sharpness", type=float, default=None, help="Override the profile's knee sharpness (inf: the hard roofline)."
)
@out_option("bound")
def bound(profile: str, online_rate: str, ceiling: float, alpha: str, knee_sharpness: float | None, out: str) -> None:
    """The most batch tokens/s the profile gives beside an online load of the harvest workload's lengths: at any
    latency (the compute bound, and the same with the chat template and each token's KV traffic and attention), and
    with every step within α of its online-alone time (H*(α)). A calculation, no engine."""
    from tidal_engine.twin import load_profile
    from tidal_workers.bench import harvest_bound as hb
    from tidal_workers.bench import oracle
    from tidal_workers.bench.workload import GPU_WORKLOAD

    out_dir, origin = begin("bound", out)
    spec = load_profile(profile)
    if knee_sharpness is not None:
        spec = dataclasses.replace(spec, knee_sharpness=knee_sharpness)
    lengths = hb.Mix.of(GPU_WORKLOAD, 0.0)  # the means, drawn once
    online = oracle.RequestClass.of(GPU_WORKLOAD.online_prompt, GPU_WORKLOAD.online_output)
    batch = oracle.RequestClass.of(GPU_WORKLOAD.batch_prompt, GPU_WORKLOAD.batch_output)
    alphas = [float(a) for a in alpha.split(",")] if alpha else []
    rows = []
    for rate in (float(r) for r in online_rate.split(",")):
        b = hb.compute_bound(spec, dataclasses.replace(lengths, online_rate=rate))
        row = {"online_rate": rate, **dataclasses.asdict(b), "online_share": round(b.online_share, 4)}
        if ceiling > 0:
            row["harvest_bound"] = round(b.harvest(ceiling), 4)
        row["any_latency_tokens_per_s"] = round(oracle.any_latency_bound(spec, rate, online, batch), 1)
        row["oracle"] = [_oracle_row(spec, rate, online, batch, a) for a in alphas]
        rows.append(row)
    means = {k: v for k, v in dataclasses.asdict(lengths).items() if k != "online_rate"}
    results = {
        "profile": spec.name,
        "profile_hash": oracle.profile_hash(spec),
        "knee_sharpness": str(spec.knee_sharpness),
        "mean_lengths": means,
        "steady_ceiling_tokens_per_s": round(oracle.steady_ceiling(spec, batch), 1),
        "ceiling": ceiling or None,
        "rows": rows,
    }
    finish("bound", origin, results, out_dir, rows)


def _oracle_row(
    spec: Profile, rate: float, online: RequestClass, batch: RequestClass, alpha: float
) -> dict[str, t.Any]:
    """One H*(α) for the JSON (α as text: inf is no JSON number); an online load that does not fit gives none."""
    from tidal_workers.bench import oracle

    try:
        h = oracle.harvest_oracle(spec, rate, online, batch, alpha)
    except ValueError as error:
        return {"alpha": str(alpha), "batch_tokens_per_s": None, "reason": str(error)}
    return {
        "alpha": str(alpha),
        "batch_tokens_per_s": round(h.batch_tokens_per_s, 1),
        "online_alone": round(h.online_alone, 2),
        "online_concurrency": round(h.online_concurrency, 2),
        "decode_step_ms": round(h.decode_step_s * 1e3, 3),
        "prompt_step_ms": round(h.prompt_step_s * 1e3, 3),
    }


@click.command()
@click.option("--profile", default="qwen2.5-7b@a6000", show_default=True, help="Twin profile to run (MODEL@GPU).")
@click.option("--reps", default=3, show_default=True, help="Repetitions of the grid and of the CPU load.")
@click.option("--steps", default=8, show_default=True, help="Steps of each cell's shape per repetition.")
@click.option("--cells", default="", help="Comma-separated indices into the grid (default: all; see docs/engine.md).")
@click.option("--cpu-duration", default=30.0, show_default=True, help="Seconds of load per CPU repetition; 0: skip.")
@click.option("--online-rate", default=20.0, show_default=True, help="Online requests/s during the CPU load.")
@click.option("--batch-lanes", default=48, show_default=True, help="Batch requests in flight during the CPU load.")
@out_option("twin")
def twin(
    profile: str,
    reps: int,
    steps: int,
    cells: str,
    cpu_duration: float,
    online_rate: float,
    batch_lanes: int,
    out: str,
) -> None:
    """The timed twin: whole-step time against the profile's T(P, C) over the grid, and its CPU use under load.

    Starts the twin of --profile (stock scheduler: vLLM's CPU platform forces the synchronous one); run it
    under the engine lock. Attainability is reported for every tabulated profile from this run's floors.
    """
    from tidal_engine.serve import start_twin
    from tidal_engine.twin import load_profile
    from tidal_engine.twin import profile_names
    from tidal_workers.bench import twin as tw

    if reps < 3:
        click.echo("note: fewer than 3 repetitions: the intervals are not figures to report", err=True)
    out_dir, origin = begin("twin", out)
    grid = [tw.GRID[int(i)] for i in cells.split(",")] if cells else list(tw.GRID)
    trace = out_dir / "twin-trace.csv"
    trace.unlink(missing_ok=True)
    spec = load_profile(profile)
    load = tw.LoadConfig(online_rate=online_rate, batch_lanes=batch_lanes)
    results: dict = {
        "profile": dataclasses.asdict(spec),
        "params": {"reps": reps, "steps": steps, "cpu_duration": cpu_duration, "load": dataclasses.asdict(load)},
        "scheduler": "stock vLLM Scheduler, synchronous (the CPU platform forces async_scheduling off)",
    }
    engine = start_twin(
        load_settings(),
        profile,
        log_path=out_dir / "twin.log",
        trace_path=trace.resolve(),
        max_model_len=tw.MAX_MODEL_LEN,
    )
    results["engine_start_s"] = engine.started_s
    try:
        click.echo(f"fidelity: {len(grid)} cells x {reps} reps ...", err=True)
        samples = tw.fidelity(engine.url, spec.name, trace, grid, reps, steps)
        profiles = [load_profile(n) for n in profile_names()]
        results["cells"] = [tw.summarize_cell(c, samples[c.label], profiles) for c in grid]
        if cpu_duration > 0:
            cpu_reps = []
            for rep in range(reps):
                click.echo(f"CPU use under load, rep {rep + 1}/{reps} ...", err=True)
                cpu_reps.append(tw.cpu_use(engine.url, spec.name, engine.pid, load, cpu_duration, seed=rep))
            results["cpu"] = {"cores": tw.summarize_cpu(cpu_reps), "reps": cpu_reps}
        rows = tw.read_trace(trace)
        results["overruns"] = {"steps": len(rows), "overruns": int(rows[-1]["overruns"]) if rows else 0}
    finally:
        engine.stop()
    finish("twin", origin, results, out_dir, tw.report(results), [trace])


@click.command()
@click.option("--profile", default="qwen2.5-7b@a6000", show_default=True, help="Profile whose model is timed.")
@click.option("--device", default="cuda", show_default=True, help="torch device: cuda (the real run) or cpu.")
@click.option("--tiny", is_flag=True, help="A two-layer stack over small cells: checks the script (CPU tests).")
@click.option("--reps", default=10, show_default=True, help="Timed steps per cell.")
@click.option("--budget-seconds", default=480.0, show_default=True, help="Cells not started by then are skipped.")
@click.option(
    "--refit",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Fit recorded runs (a calibrate.json, or a mixed-step run's rows) instead of timing; repeatable.",
)
@out_option("calibrate")
def calibrate(profile: str, device: str, tiny: bool, reps: int, budget_seconds: float, refit: tuple, out: str) -> None:
    """Time a 7B-class transformer stack (random weights, PyTorch only) over the twin's grid; fit a measured profile.

    Writes calibrate.json (samples, derived against measured per cell, the fit) and profile-measured.toml
    (a [gpus."GPU-measured"] table to put beside the derived one in tidal_engine/twin_profiles.toml).
    With --refit, no GPU: the fit of the recorded steps, each with its error under it and why a step is left out.
    """
    import json

    from tidal_engine.twin import load_profile
    from tidal_engine.twin import profile_tables
    from tidal_workers.bench import calibrate as cb

    spec = load_profile(profile)
    model, _, gpu = profile.partition("@")
    out_dir, origin = begin("calibrate", out)
    if refit:
        steps = [step for path in refit for step in cb.recorded_steps(json.loads(Path(path).read_text()))]
        measured = cb.refit(spec, steps)
    else:
        shape = cb.TINY if tiny else cb.StackShape.of(spec, cb.INTERMEDIATE[model])
        measured = cb.run(spec, shape, cb.TINY_GRID if tiny else cb.GRID, device, reps, budget_seconds)
    files: list[Path] = []
    if measured["fit"]:
        files.append(out_dir / "profile-measured.toml")
        files[0].write_text(cb.measured_toml(gpu, profile_tables()["gpus"][gpu], measured["fit"]))
    headline = {k: measured[k] for k in ("device", "seconds", "table", "fit", "skipped") if k in measured}
    results = {"profile": profile, "tiny": tiny, "refit": list(refit), **measured}
    finish("calibrate", origin, results, out_dir, headline, files)


@click.command("kv-probe")
@click.option(
    "--connectors",
    default="example,offloading,simple-cpu,simple-disk,lmcache",
    show_default=True,
    help="Connectors to probe (names in tidal_workers.bench.kv_probe.CONNECTORS); empty: none.",
)
@click.option("--thaw/--no-thaw", default=True, show_default=True, help="Also time thawed TTFT against recompute.")
@click.option("--reps", default=5, show_default=True, help="Prompts per length in the thaw timing.")
@out_option("kv-probe")
def kv_probe(connectors: str, thaw: bool, reps: int, out: str) -> None:
    """KV connectors on this engine build: freeze, restart, thaw (docs/engine.md); thawed TTFT (docs/results/2026-12-01-kv-thaw)."""
    from tidal_engine.tiny import build_tiny
    from tidal_workers.bench import kv_probe as kp

    out_dir, origin = begin("kv-probe", out)
    settings = load_settings()
    model_dir = build_tiny(settings.home, "dense")
    results: dict = {"engine": "dense vLLM-CPU, float32, eager"}
    names = [n.strip() for n in connectors.split(",") if n.strip()]
    results["probe"] = kp.probe(kp.ProbeConfig(home=Path(settings.home), model_dir=model_dir, work=out_dir), names)
    if thaw:
        results["thaw"] = kp.thaw_ttft(kp.ThawConfig(model_dir=model_dir, work=out_dir, reps=reps))
    finish("kv-probe", origin, results, out_dir, results)


@click.command()
@click.option("--duration", default=30.0, show_default=True, help="Seconds per arm.")
@click.option("--reps", default=2, show_default=True, help="ABBA blocks (each runs both arms).")
@click.option("--online-rate", default=1.0, show_default=True, help="Online requests/s through the router.")
@click.option("--max-inflight", default=4, show_default=True, help="Ceiling of the gate's batch target.")
@out_option("disagg")
def disagg(duration: float, reps: int, online_rate: float, max_inflight: int, out: str) -> None:
    """A-D: prefill engine + decode engine + KV through TidalFreezeConnector + a router, against the same two engines
    run unified; batch admitted by the gate through the `disagg` signal map (docs/results/2026-12-01-disagg)."""
    from concurrent.futures import ThreadPoolExecutor

    from tidal_engine.serve import EngineOptions
    from tidal_engine.serve import freeze_connector_args
    from tidal_engine.serve import start_engine
    from tidal_engine.tiny import build_tiny
    from tidal_workers.bench import disagg as dg

    out_dir, origin = begin("disagg", out)
    settings = load_settings()
    storage = out_dir / "frozen"
    storage.mkdir(exist_ok=True)
    options = EngineOptions(
        model=str(build_tiny(settings.home, "dense")),
        served_model_name="dense",
        max_num_seqs=16,
        extra_args=freeze_connector_args(storage),
    )
    # One core each (the default binds both engines to core 0), started together.
    with ThreadPoolExecutor(2) as pool:
        starts = [
            pool.submit(
                start_engine, options, log_path=out_dir / f"{name}.log", env={"VLLM_CPU_OMP_THREADS_BIND": str(i)}
            )
            for i, name in enumerate(("prefill", "decode"))
        ]
        engines = [f.result() for f in starts]
        router = dg.Router(engines[0].url, engines[1].url)
        gate_settings = settings.replace(
            gate_mode="aimd",
            gate_signals="disagg",
            gate_metrics_urls=f"prefill={engines[0].url}/metrics,decode={engines[1].url}/metrics",
            min_inflight=0,
            max_inflight=max_inflight,
            initial_inflight=1,
        )
        cfg = dg.DisaggConfig(duration=duration, reps=reps, online_rate=online_rate, max_inflight=max_inflight)
        try:
            arms = dg.run(router, cfg, gate_settings, [e.pid for e in engines])
        finally:
            router.stop()
            for e in engines:
                e.stop()
    results = {
        "engine": "2 x dense vLLM-CPU (one core each), TidalFreezeConnector on a shared folder",
        "params": dataclasses.asdict(cfg),
        "summary": dg.summarize(arms),
        "arms": arms,
    }
    finish("disagg", origin, results, out_dir, results["summary"])


@click.command()
@PROFILE_OPTION
@click.option("--load", "load_name", default="flat-8", show_default=True, help="The online load (workload.py).")
@click.option("--mix", default="standard", show_default=True, help="The batch mix (workload.py).")
@click.option("--alphas", default="1.1", show_default=True, help="TidalScheduler's α_set values, comma-separated.")
@click.option("--peer-concurrency", default="", help="vLLM-alone arms: batch requests at the engine, comma-separated.")
@click.option("--latency-gate-alphas", default="", help="The latency gate's α_set values (outside), comma-separated.")
@click.option("--batch", default=185, show_default=True, help="Batch requests kept at the engine (the gate's ceiling).")
@click.option(
    "--max-num-batched-tokens", "tau", default=0, help="The engine's τ (0: the profile's); the oracle's stays."
)
@click.option("--seeds", default=3, show_default=True, help="Online traces, one per seed; every arm runs each.")
@click.option("--seconds", default=300.0, show_default=True, help="Virtual seconds per run.")
@click.option("--warmup-seconds", default=80.0, show_default=True, help="Virtual seconds left out at the start.")
@click.option("--lead-seconds", default=20.0, show_default=True, help="The online load alone before the batch comes.")
@out_option("virtual")
def virtual(
    profile: str,
    load_name: str,
    mix: str,
    alphas: str,
    peer_concurrency: str,
    latency_gate_alphas: str,
    batch: int,
    tau: int,
    seeds: int,
    seconds: float,
    warmup_seconds: float,
    lead_seconds: float,
    out: str,
) -> None:
    """The real schedulers in virtual time: every step takes the profile's T(P, C), nothing sleeps (about a minute
    a run). Design evidence for a change to the plugin, beside online alone on the same traces; the claims are the
    twin's (`tidal bench frontier`). docs/benchmarks.md."""
    from tidal_engine.tiny import build_tiny
    from tidal_engine.twin import load_profile
    from tidal_workers.bench import oracle
    from tidal_workers.bench import stats
    from tidal_workers.bench import virtual as vt
    from tidal_workers.bench.workload import BATCH_MIXES
    from tidal_workers.bench.workload import ONLINE_LOADS

    if load_name not in ONLINE_LOADS or mix not in BATCH_MIXES:
        raise click.BadParameter(f"--load one of {', '.join(ONLINE_LOADS)}; --mix one of {', '.join(BATCH_MIXES)}")
    out_dir, origin = begin("virtual", out)
    settings = load_settings()
    model_dir = str(build_tiny(settings.home))
    twin, load, workload = load_profile(profile), ONLINE_LOADS[load_name], BATCH_MIXES[mix].workload()
    engine = dataclasses.replace(twin, max_num_batched_tokens=tau) if tau else twin
    arms = [vt.Arm(f"inside-{a:g}", batch, a) for a in numbers(alphas)]
    arms += [vt.Arm(f"vllm-priority-{n:g}", int(n)) for n in numbers(peer_concurrency)]
    arms += [vt.Arm(f"outside-latency-{a:g}", batch, gate_alpha_set=a) for a in numbers(latency_gate_alphas)]
    online_class = oracle.RequestClass.of(workload.online_prompt, workload.online_output)
    batch_class = oracle.RequestClass.of(workload.batch_prompt, workload.batch_output)

    def oracle_at(alpha: float) -> float:
        return oracle.harvest_oracle(twin, load.rate, online_class, batch_class, alpha).batch_tokens_per_s

    harvest_at = oracle_at if load.trace == "flat" else None  # H* is a steady state's: flat loads only

    shape = {"seconds": seconds, "warmup_s": warmup_seconds, "lead_s": lead_seconds}
    samples: dict[str, list[dict]] = {arm.name: [] for arm in arms}
    for seed in range(seeds):  # virtual time: nothing carries from one run to the next, so order is immaterial
        alone = vt.run(vt.Arm("online-alone"), engine, workload, load, settings, model_dir, seed=seed, **shape)
        for arm in arms:
            co = vt.run(arm, engine, workload, load, settings, model_dir, seed=seed, **shape)
            samples[arm.name].append(
                {"seed": seed, **vt.judged(alone, co, harvest_at), "alone": alone.figures(), "co": co.figures()}
            )
            click.echo(f"seed {seed} {arm.name}: {json.dumps(samples[arm.name][-1]['inflation'])}", err=True)
    summary = {
        name: {
            "harvest_tokens_per_s": stats.interval([r["harvest_tokens_per_s"] for r in runs]),
            "alpha_m": stats.interval([r["alpha_m"] for r in runs]),
            "E": stats.interval([r["E"] for r in runs]) if harvest_at else None,
            **{q: stats.interval([r["inflation"][q] for r in runs]) for q in vt.INFLATIONS},
        }
        for name, runs in samples.items()
    }
    results = {
        "profile": profile,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "load": load_name,
        "mix": mix,
        **shape,
        "summary": summary,
        "runs": samples,
    }
    finish("virtual", origin, results, out_dir, summary)
