"""`tidal bench frontier`: the harvest frontier in steady windows, the peers in the same run (frontier.py)."""

from __future__ import annotations

import dataclasses
import signal
import typing as t
from pathlib import Path

import click

from config import Settings
from config import load_settings
from tidal_workers.bench.cli.common import PROFILE_OPTION
from tidal_workers.bench.cli.common import begin
from tidal_workers.bench.cli.common import deployment_ceiling
from tidal_workers.bench.cli.common import finish
from tidal_workers.bench.cli.common import log
from tidal_workers.bench.cli.common import numbers
from tidal_workers.bench.cli.common import out_option


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What --quick and a full run measure unless told otherwise (frontier_plan.py has the knob settings)."""

    loads: str
    mixes: str
    window_s: float
    window_max_s: float
    settle_max_s: float


QUICK = Sizes("flat-8", "standard", 120.0, 240.0, 180.0)
FULL = Sizes("flat-8,flat-5", "standard,decode-heavy", 180.0, 420.0, 420.0)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _check(names: t.Sequence[str], known: t.Iterable[str], option: str) -> None:
    known = list(known)
    if unknown := [n for n in names if n not in known]:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; one of {', '.join(known)}", param_hint=option)


@click.command()
@PROFILE_OPTION
@click.option("--quick", is_flag=True, help="One load (flat 8/s), one mix (standard), 3 points per technique: ~1 h.")
@click.option(
    "--loads",
    default="",
    help="Online loads, comma-separated: flat-8, flat-5, diurnal-5, step-1-8 (the instant; full: flat-8,flat-5).",
)
@click.option(
    "--mixes", default="", help="Batch mixes: standard, decode-heavy, long-prompt (full: standard,decode-heavy)."
)
@click.option(
    "--techniques",
    default="outside,inside,vllm-priority",
    show_default=True,
    help="The arms: outside, inside, vllm-priority, outside-latency (the latency gate), outside-staged (outside, each "
    "batch prompt staged through the prefix cache).",
)
@click.option(
    "--outside-knobs",
    default="",
    help="Gate ceilings below the deployment's (which is always measured), outside's and outside-staged's.",
)
@click.option("--inside-knobs", default="", help="TidalScheduler's α_set values (a step ÷ T̂ of its online work alone).")
@click.option("--latency-gate-knobs", default="", help="The latency gate's α_set values (outside-latency).")
@click.option(
    "--gate-reference-ms",
    default=0.0,
    show_default=True,
    help="outside-latency's reference inter-token latency (TIDAL_GATE_REFERENCE_ITL_MS); 0: the gate fits it.",
)
@click.option(
    "--gate-profile",
    is_flag=True,
    help="outside-latency's reference from the twin's profile at the online load it serves (TIDAL_GATE_PROFILE).",
)
@click.option(
    "--stage-tokens",
    default=0,
    show_default=True,
    help="Stage outside's and outside-latency's batch prompts through the prefix cache this many tokens a request "
    "(TIDAL_PREFILL_STAGE_TOKENS; 0: whole; outside-staged always stages 128).",
)
@click.option(
    "--stage-min-tokens",
    default=next(f.default for f in dataclasses.fields(Settings) if f.name == "prefill_stage_min_tokens"),
    show_default=True,
    help="Staged arms send prompts of this many tokens or fewer whole (TIDAL_PREFILL_STAGE_MIN_TOKENS; 0: stage "
    "every prompt longer than a chunk).",
)
@click.option("--peer-concurrency", default="", help="vLLM-alone batch requests at the engine (full: 4,8,16,32,64).")
@click.option("--reps", default=1, show_default=True, help="Repetitions of every block; 3 or more add aggregates.")
@click.option("--window-seconds", type=float, default=0.0, help="A flat window (quick 120, full 180).")
@click.option(
    "--window-max-seconds",
    type=float,
    default=-1.0,
    help="A flat co-served window short of 200 batch completions runs on, up to this (quick 240, full 420; 0: never).",
)
@click.option("--diurnal-window-seconds", default=600.0, show_default=True, help="A diurnal window: one period.")
@click.option(
    "--settle-max-seconds", type=float, default=0.0, help="Longest wait for admission to settle (quick 180, full 420)."
)
@click.option(
    "--hold-seconds", default=40.0, show_default=True, help="Admission holds its level this long to settle (steady.py)."
)
@click.option("--baseline-lead-seconds", default=20.0, show_default=True, help="Online alone before its window.")
@click.option(
    "--time-scale",
    default=1.0,
    show_default=True,
    help="Every twin step, online gap, control period and window this many times as long (issue 35, item 8).",
)
@click.option("--ceiling/--no-ceiling", default=True, show_default=True, help="Measure each mix's all-slots ceiling.")
@click.option("--max-num-seqs", default=0, type=int, help="Engine slots (0: the profile's).")
@click.option("--report-only", is_flag=True, help="Recompute the report from the run directory; measure nothing.")
@out_option("frontier")
def frontier(
    profile: str,
    quick: bool,
    loads: str,
    mixes: str,
    techniques: str,
    outside_knobs: str,
    inside_knobs: str,
    latency_gate_knobs: str,
    gate_reference_ms: float,
    gate_profile: bool,
    stage_tokens: int,
    stage_min_tokens: int,
    peer_concurrency: str,
    reps: int,
    window_seconds: float,
    window_max_seconds: float,
    diurnal_window_seconds: float,
    settle_max_seconds: float,
    hold_seconds: float,
    baseline_lead_seconds: float,
    time_scale: float,
    ceiling: bool,
    max_num_seqs: int,
    report_only: bool,
    out: str,
) -> None:
    """Each technique's knob swept on the timed twin, each point a steady window judged and reported with its
    harvest, E = harvest ÷ H*(α_m) and its online TTFT / TBT inflations (95 % intervals), beside the peers: vLLM alone
    with the batch at the lowest priority, and the online load alone. Writes every point's JSON under --out as it
    goes; run the same command again to resume (points already written are skipped). docs/benchmarks.md."""
    from tidal_workers.bench import frontier_plan as fp
    from tidal_workers.bench import frontier_report
    from tidal_workers.bench.workload import BATCH_MIXES
    from tidal_workers.bench.workload import ONLINE_LOADS

    out_dir, origin = begin("frontier", out)
    run = fp.RunDir(out_dir)
    if report_only:
        plan = run.plan()
    else:
        sizes = QUICK if quick else FULL
        chosen = _names(techniques)
        knobs = {tech: given for tech, given in (fp.QUICK_KNOBS if quick else fp.FULL_KNOBS).items() if tech in chosen}
        for technique, given in (
            ("outside", outside_knobs),
            ("outside-staged", outside_knobs),
            ("inside", inside_knobs),
            ("outside-latency", latency_gate_knobs),
            ("vllm-priority", peer_concurrency),
        ):
            if given and technique in chosen:  # outside's ceilings are outside-staged's too, where it runs
                knobs[technique] = numbers(given)
        plan = fp.FrontierPlan(
            profile=profile,
            loads=_names(loads or sizes.loads),
            mixes=_names(mixes or sizes.mixes),
            techniques=chosen,
            knobs=knobs,
            gate_ceiling=deployment_ceiling(profile, max_num_seqs),
            reps=reps,
            window_s=window_seconds or sizes.window_s,
            window_max_s=sizes.window_max_s if window_max_seconds < 0 else window_max_seconds,
            diurnal_window_s=diurnal_window_seconds,
            settle_max_s=settle_max_seconds or sizes.settle_max_s,
            hold_s=hold_seconds,
            baseline_lead_s=baseline_lead_seconds,
            ceiling=ceiling,
            time_scale=time_scale,
            stage_tokens=stage_tokens,
            stage_min_tokens=stage_min_tokens if stage_tokens else 0,
            gate_reference_ms=gate_reference_ms,
            gate_profile=gate_profile,
        )
        if gate_profile and gate_reference_ms:
            raise click.UsageError("--gate-profile and --gate-reference-ms each set the reference: give one")
        _check(plan.loads, ONLINE_LOADS, "--loads")
        _check(plan.mixes, BATCH_MIXES, "--mixes")
        _check(plan.techniques, fp.TECHNIQUES, "--techniques")
        try:
            run.open(plan)
        except fp.PlanMismatch as exc:
            raise click.ClickException(str(exc)) from exc
        _measure(plan, run, max_num_seqs)
    report = frontier_report.Report(plan, run.records())
    results = {**report.results(), "failed": run.failures()}
    text = frontier_report.table(results)
    (out_dir / "frontier.md").write_text(text + "\n")
    figure = frontier_report.plot(report, results, out_dir / "frontier.png")
    finish("frontier", origin, results, out_dir, text, [out_dir / "frontier.md", figure])


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False))
@click.argument("arm", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--tolerance", default=0.1, show_default=True, help="A ratio holds when its interval lies inside 1 ± this."
)
@out_option("frontier-compare")
def frontier_compare(base: str, arm: str, tolerance: float, out: str) -> None:
    """ARM ÷ BASE of every figure of two `tidal bench frontier` run directories, point by point, with 95 % intervals
    (frontier_compare.py): the time-scale check (issue 35, item 8: a run at --time-scale 2 over one at 1) or a change
    to a technique. docs/benchmarks.md."""
    from tidal_workers.bench import frontier_compare as fc
    from tidal_workers.bench import frontier_plan as fp
    from tidal_workers.bench import frontier_report

    out_dir, origin = begin("frontier-compare", out)
    reports = []
    for path in (base, arm):
        run = fp.RunDir(Path(path))
        reports.append(frontier_report.Report(run.plan(), run.records()))
    entries = fc.compare(reports[0], reports[1], tolerance)
    text = fc.table(entries, tolerance)
    (out_dir / "compare.md").write_text(text + "\n")
    results = {
        "base": {"path": base, "plan": reports[0].plan.as_dict()},
        "arm": {"path": arm, "plan": reports[1].plan.as_dict()},
        "tolerance": tolerance,
        "points": entries,
    }
    finish("frontier-compare", origin, results, out_dir, text, [out_dir / "compare.md"])


def _measure(plan: t.Any, run: t.Any, max_num_seqs: int) -> None:
    """The run itself; SIGTERM and SIGINT end it as Ctrl-C does (SIGINT too when started in the background, which
    ignores it), so its engines and workers stop with it."""
    from tidal_workers.bench.engines import EngineRequest
    from tidal_workers.bench.frontier import Frontier

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    request = EngineRequest("twin", plan.twin_profile, max_num_seqs)
    Frontier(plan, request, load_settings(), run, log).run()
