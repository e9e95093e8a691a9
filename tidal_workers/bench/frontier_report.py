"""The frontier's figures, table and plot, all computed from the run directory's point records.

Per point:

- its verdict (``verdict``): the steady-window rules (steady.judge; no drift rule on a diurnal or a step load, and
  no prefill-ratio rule on a step, which moves the batch on purpose) on the
  window's samples, plus the point's own: the batch's admission had not settled when the window opened, the
  backlog ran out, online requests failed, its block's online-alone window is itself invalid or ran on another
  machine (where both record theirs: a resumed run's points can come from another VM). An invalid point
  is listed with every reason and left out of every aggregate;
- harvest: batch generated tokens/s in the window, with a 95 % interval from its 10-s blocks resampled;
- inflation: each online TTFT and TBT percentile (p50, p99) over the same percentile in its block's online-alone
  window; both windows sent the same trace, so the interval resamples the requests in pairs;
- E = harvest ÷ H*(α_m) (efficiency.py) on the profile the twin ran, its interval the harvest's over that H*;
- "% of the steady ceiling": over the measured ceiling when it is valid, and over the model's (oracle.py);
- on a step load, the instant (step_response.py): the online inflation after the step, against α_set.

With three or more valid repetitions of a setting, ``aggregates`` gives each figure's mean over them with a
bootstrap interval (stats.bootstrap) and a Student-t one (stats.t_bounds, the table's), and each technique's harvest
over vLLM alone's at the same α_m, the peer's measured curve interpolated; with fewer, each repetition stands alone
with its within-window intervals.
"""

from __future__ import annotations

import collections
import dataclasses
import typing as t
from pathlib import Path

import numpy as np

from tidal_engine.twin import load_profile
from tidal_workers.bench import efficiency
from tidal_workers.bench import oracle
from tidal_workers.bench import samples
from tidal_workers.bench import stats
from tidal_workers.bench import steady
from tidal_workers.bench import step_response
from tidal_workers.bench.frontier_plan import CEILING
from tidal_workers.bench.frontier_plan import COSERVED
from tidal_workers.bench.frontier_plan import KNOB_NAMES
from tidal_workers.bench.frontier_plan import ONLINE_ALONE
from tidal_workers.bench.frontier_plan import STEP_AT_S
from tidal_workers.bench.frontier_plan import STOCK_GATE_ARMS
from tidal_workers.bench.frontier_plan import FrontierPlan
from tidal_workers.bench.frontier_plan import rate_fn
from tidal_workers.bench.workload import BATCH_MIXES
from tidal_workers.bench.workload import ONLINE_LOADS

Record = dict[str, t.Any]
LATENCIES = ("ttft", "tbt")
QUANTILES = {"p50": 0.5, "p99": 0.99}
ALPHA_KNOBS = ("inside", "outside-latency")  # the techniques whose knob is an α_set
INSTANT = ("transient", "recovered", "ttft_transient", "ttft_recovered")  # step_response's figures
PEER = "vllm-priority"  # vLLM alone, the batch at the lowest priority: what each technique must beat
ONLINE_ERRORS_MAX = 0.01  # a window whose online requests failed more often measured something else
COLOURS = {
    "outside": "tab:blue",
    "inside": "tab:orange",
    "vllm-priority": "tab:green",
    "outside-latency": "tab:purple",
    "outside-staged": "tab:cyan",
}


def steady_ratio(mix: str) -> float:
    """The mix's steady batch prefill per generated token: mean prompt (with the chat template) ÷ mean output."""
    batch = BATCH_MIXES[mix]
    request = oracle.RequestClass.of(batch.prompt, batch.output)
    return request.prompt / request.output


def window_samples(record: Record) -> list[steady.Sample]:
    window = record["window"]
    return steady.within([steady.Sample(*s) for s in record["samples"]], window["opens"], window["closes"])


def verdict(record: Record, plan: FrontierPlan, baseline: Record | None) -> steady.Verdict:
    """The point's verdict (module docstring); ``baseline`` is its block's online-alone record, where known."""
    point = record["point"]
    kind = point["kind"]
    steps = record.get("steps") or {}
    overruns = steps.get("overrun_share")
    if kind == ONLINE_ALONE:
        reasons = steady.overrun_reasons(overruns) + _online_reasons(record)
        seconds = record["window"]["closes"] - record["window"]["opens"]
        return steady.Verdict(not reasons, tuple(reasons), seconds, None, None, 0.0, None, 0.0, overruns)
    load = ONLINE_LOADS[point["load"]] if point["load"] else None
    judged = steady.judge(
        window_samples(record),
        steady_ratio(point["mix"]),
        overrun_share=overruns,
        drift_rule=load is None or load.trace == "flat",
        ratio_rule=load is None or load.trace != "step",
    )
    reasons = list(judged.reasons)
    admission = record["window"].get("admission")
    if admission is not None and not admission["settled"]:
        reasons.append(
            f"the batch's admission had not settled when the window opened ({record['window']['settle_s']:.0f} s: "
            f"{admission['level']:.0f} at the engine, {admission['turnover']:.0f} completions at that level)"
        )
    if record.get("flowed") is False:
        reasons.append("no batch item completed before the settling began")
    if "backlog_submitted" in record and record["samples"]:
        last = record["samples"][-1]
        if last[2] + last[1] >= record["backlog_submitted"]:
            reasons.append(f"the backlog of {record['backlog_submitted']} items ran out")
    if kind == COSERVED:
        reasons += _online_reasons(record)
        if baseline is not None:
            if not verdict(baseline, plan, None).valid:
                reasons.append("its block's online-alone window is invalid")
            ran, alone = record.get("machine"), baseline.get("machine")
            if ran and alone and ran != alone:  # the host's share of every step differs, and the inflation with it
                reasons.append(f"ran on {ran}, its block's online-alone window on {alone}")
    return dataclasses.replace(judged, valid=not reasons, reasons=tuple(reasons))


def _online_reasons(record: Record) -> list[str]:
    summary = record["online"]["summary"]
    if summary["requests"] and summary["errors"] / summary["requests"] > ONLINE_ERRORS_MAX:
        return [f"{summary['errors']} of {summary['requests']} online requests failed"]
    return []


def _interval(value: float | None, bounds: tuple[float, float] | None) -> dict[str, float | None]:
    low, high = bounds if bounds else (None, None)
    return {"value": value, "low": low, "high": high}


def harvest(record: Record, time_scale: float = 1.0) -> dict[str, float | None]:
    """Batch generated tokens/s in the window, with its block-bootstrap interval; in the GPU's seconds (a window
    run ``time_scale`` times slower harvested that many times less a wall second)."""
    window = window_samples(record)
    if len(window) < 2:
        return _interval(None, None)
    seconds = window[-1].at - window[0].at
    value = time_scale * (window[-1].generated - window[0].generated) / seconds
    cut = steady.blocks(window)
    bounds = steady.ratio_interval(cut.generated, cut.seconds)
    return _interval(value, (time_scale * bounds[0], time_scale * bounds[1]) if bounds else None)


def inflations(record: Record, baseline: Record) -> dict[str, stats.Interval | None]:
    """{ttft_p50: interval, ...}: the point's percentiles over its baseline's, the same requests paired. Online
    alone runs the longest window (frontier_plan.longest_window_for): a co-served window's requests are the first
    of its trace."""
    co = samples.per_request(record["online"]["records"])
    base = samples.per_request(baseline["online"]["records"])
    out: dict[str, stats.Interval | None] = {}
    for name in LATENCIES:
        if len(co[name]) > len(base[name]):
            raise ValueError(f"{record['point']} sent more online requests than its baseline")
        paired = base[name][: len(co[name])]
        ratios = stats.paired_quantile_ratios(paired, co[name], list(QUANTILES.values()))
        out.update({f"{name}_{q}": r for q, r in zip(QUANTILES, ratios, strict=True)})
    return out


class Report:
    """Every figure of a run directory's records under its plan."""

    def __init__(self, plan: FrontierPlan, records: list[Record]):
        self.plan, self.records = plan, records
        self.profile = load_profile(plan.profile)
        self.by_name = {_name(r["point"]): r for r in records}
        self._oracles: dict[str, efficiency.Oracles] = {}

    def oracles(self, mix: str) -> efficiency.Oracles:
        if mix not in self._oracles:
            workload = BATCH_MIXES[mix].workload()
            self._oracles[mix] = efficiency.Oracles(
                self.profile,
                oracle.RequestClass.of(workload.online_prompt, workload.online_output),
                oracle.RequestClass.of(workload.batch_prompt, workload.batch_output),
            )
        return self._oracles[mix]

    def baseline(self, point: dict[str, t.Any]) -> Record | None:
        name = "__".join([ONLINE_ALONE, point["load"], point["mix"]]) + f"__r{point['rep']}"
        return self.by_name.get(name)

    def ceiling(self, mix: str) -> Record | None:
        return self.by_name.get(f"{CEILING}__{mix}__r0")

    def rates(self, load_name: str) -> list[float]:
        """The online rates a point's oracle averages over: one for a flat load, samples across a diurnal phase or
        a step's window."""
        load = ONLINE_LOADS[load_name]
        if load.trace == "flat":
            return [load.rate]
        window = self.plan.window_for(load.trace)
        return efficiency.phase_rates(rate_fn(load, window), window)

    def rows(self) -> list[dict[str, t.Any]]:
        """One summary row per point, in plan order."""
        order = {p.name: i for i, p in enumerate(self.plan.points())}
        ordered = sorted(self.records, key=lambda r: order.get(_name(r["point"]), len(order)))
        return [self.row(r) for r in ordered]

    def row(self, record: Record) -> dict[str, t.Any]:
        point = record["point"]
        baseline = self.baseline(point) if point["kind"] == COSERVED else None
        judged = verdict(record, self.plan, baseline)
        row: dict[str, t.Any] = {
            "name": _name(point),
            **point,
            "knob_means": KNOB_NAMES.get(point["technique"] or "", None),
            "knob_detail": record.get("knob"),
            "valid": judged.valid,
            "reasons": list(judged.reasons),
            "verdict": judged.as_dict(),
            "steps": record.get("steps"),
            "settle_s": record["window"]["settle_s"],
            "profile": record.get("profile"),
            "profile_hash": record.get("profile_hash"),
        }
        if point["kind"] == ONLINE_ALONE:
            row["online"] = _gpu_seconds(record["online"]["summary"], self.plan.time_scale)
            return row
        row["harvest"] = harvest(record, self.plan.time_scale)
        oracles = self.oracles(point["mix"])
        model_ceiling = oracles.steady_ceiling()
        row["model_steady_ceiling"] = model_ceiling
        if point["kind"] == CEILING:
            return row
        value = row["harvest"]["value"]
        measured = self.ceiling(point["mix"])
        if measured is not None and verdict(measured, self.plan, None).valid and value is not None:
            ceiling = harvest(measured, self.plan.time_scale)["value"]
            row["pct_measured_ceiling"] = 100 * value / ceiling if ceiling else None
        row["pct_model_ceiling"] = 100 * value / model_ceiling if value is not None else None
        if baseline is None:
            row["reasons"].append("no online-alone window in its block yet: no inflation, no E")
            row["valid"] = False
            return row
        inflation = inflations(record, baseline)
        row["inflation"] = {k: v.as_dict() if v else None for k, v in inflation.items()}
        alpha = efficiency.alpha_m(v.value if v else None for v in inflation.values())
        h_star = oracles.h_star_over(alpha, self.rates(point["load"]))
        row.update(alpha_m=alpha, h_star=h_star)
        if ONLINE_LOADS[point["load"]].trace == "step":
            alpha_set = point["knob"] if point["technique"] in ALPHA_KNOBS else None
            row["step"] = step_response.response(
                record["online"]["records"], baseline["online"]["records"], STEP_AT_S, alpha_set, self.plan.time_scale
            ).as_dict()
        e = efficiency.efficiency(value, h_star) if value is not None else None
        low, high = row["harvest"]["low"], row["harvest"]["high"]
        row["E"] = {
            "value": e,
            "low": efficiency.efficiency(low, h_star) if low is not None else None,
            "high": efficiency.efficiency(high, h_star) if high is not None else None,
        }
        return row

    def aggregates(self, rows: list[dict[str, t.Any]]) -> list[dict[str, t.Any]]:
        """Per setting with three or more valid repetitions: each figure's mean with its bootstrap and its Student-t
        interval; and each technique's harvest beside vLLM alone's at its mean α_m (efficiency.peer_at), where
        the peer was measured in the same load and mix with three repetitions, the ratio's bounds carrying both the
        harvest's and α_m's t intervals (efficiency.over_peer)."""
        groups: dict[tuple, list[dict[str, t.Any]]] = collections.defaultdict(list)
        for row in rows:
            if row["kind"] == COSERVED and row["valid"]:
                groups[(row["load"], row["mix"], row["technique"], row["knob"])].append(row)
        out = []
        for (load, mix, technique, knob), group in groups.items():
            if len(group) < stats.MIN_REPS:
                continue
            figures = {
                "harvest": [r["harvest"]["value"] for r in group],
                "E": [r["E"]["value"] for r in group],
                "alpha_m": [r["alpha_m"] for r in group],
                **{k: [r["inflation"][k]["value"] for r in group] for k in group[0]["inflation"]},
            }
            if group[0].get("step"):  # the instant, judged on the repetitions too (issue 36 item 3)
                figures.update({f"instant_{k}": [r["step"][k] for r in group] for k in INSTANT})
            present = {k: [v for v in vs if v is not None] for k, vs in figures.items()}
            out.append(
                {
                    "load": load,
                    "mix": mix,
                    "technique": technique,
                    "knob": knob,
                    **{k: {**stats.interval(vs), **stats.t_bounds(vs)} for k, vs in present.items()},
                }
            )
        peers: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
        for agg in out:
            if agg["technique"] == PEER:
                peers[(agg["load"], agg["mix"])].append((agg["alpha_m"]["value"], agg["harvest"]["value"]))
        for agg in out:
            curve = peers.get((agg["load"], agg["mix"])) if agg["technique"] != PEER else None
            at = efficiency.peer_at(agg["alpha_m"]["value"], curve) if curve else None
            agg["peer_harvest"] = at
            agg["over_peer"] = (
                efficiency.over_peer(_t_triple(agg["harvest"]), _t_triple(agg["alpha_m"]), curve) if curve else None
            )
        return out

    def results(self) -> dict[str, t.Any]:
        rows = self.rows()
        return {
            "plan": self.plan.as_dict(),
            "profile": self.plan.profile,
            "profile_hash": oracle.profile_hash(self.profile),
            "steady_ratios": {mix: steady_ratio(mix) for mix in self.plan.mixes},
            "rows": rows,
            "aggregates": self.aggregates(rows),
            "invalid": [{"name": r["name"], "reasons": r["reasons"]} for r in rows if not r["valid"]],
        }


def _gpu_seconds(summary: dict[str, t.Any], time_scale: float) -> dict[str, t.Any]:
    """An online summary's latencies in the GPU's seconds (its counts as they are)."""
    latency = ("ttft_", "tbt_", "late_")
    return {
        k: v / time_scale if k.startswith(latency) and not k.endswith("_samples") and v is not None else v
        for k, v in summary.items()
    }


def _name(point: dict[str, t.Any]) -> str:
    parts = [point["kind"], point.get("load"), point["mix"]]
    if point.get("technique") is not None:
        parts.append(f"{point['technique']}-{point['knob']:g}")
    return "__".join(p for p in parts if p) + f"__r{point['rep']}"


def _fig(iv: dict[str, t.Any] | None, fmt: str = "{:.0f}") -> str:
    if not iv or iv.get("value") is None:
        return "–"
    text = fmt.format(iv["value"])
    if iv.get("low") is not None and iv.get("high") is not None:
        text += f" [{fmt.format(iv['low'])}, {fmt.format(iv['high'])}]"
    return text


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _instant(row: dict[str, t.Any]) -> str:
    """A step load's point in one line: the inflation just after the step, and once it should have recovered."""
    step = row["step"]
    verdict = "" if step["holds"] is None else f"; {'within' if step['holds'] else 'NOT within'} α_set"
    return (
        f"- the instant, {row['technique']} {row['knob']:g} ({row['load']}, {row['mix']}): online ITL p50 "
        f"{_times(step['transient'])} over the first {step_response.SETTLE_S:.0f} s after the step, "
        f"{_times(step['recovered'])} over the {step_response.HOLD_S:.0f} s after that (TTFT p50 "
        f"{_times(step['ttft_transient'])}, {_times(step['ttft_recovered'])}){verdict}"
    )


def _plan_notes(plan: dict[str, t.Any]) -> list[str]:
    """What the plan set for its arms beyond their knobs: a given gate reference, staged prompts."""
    techniques = plan.get("techniques", ())
    notes = []
    if plan.get("gate_reference_ms") and "outside-latency" in techniques:
        notes.append(f"outside-latency: the reference inter-token latency given, {plan['gate_reference_ms']:g} ms.")
    elif plan.get("gate_profile") and "outside-latency" in techniques:
        notes.append("outside-latency: the reference from the twin's profile at the online load served.")
    staged = [arm for arm in techniques if arm in STOCK_GATE_ARMS]
    if plan.get("stage_tokens") and staged:
        whole = f" ({plan['stage_min_tokens']} tokens or fewer: whole)" if plan.get("stage_min_tokens") else ""
        notes.append(f"{' and '.join(staged)}: batch prompts staged {plan['stage_tokens']} tokens a request{whole}.")
    return notes


def table(results: dict[str, t.Any]) -> str:
    """One line per co-served point (Markdown), then the ceilings and the online-alone windows."""
    head = (
        "| load | mix | technique | knob | harvest tok/s [95 %] | E [95 %] | α_m | TTFT p50× | TTFT p99× | TBT p50× "
        "| TBT p99× | % steady ceiling (measured / model) | overruns | valid |"
    )
    notes = [f"{note}\n" for note in _plan_notes(results.get("plan") or {})]  # each a paragraph above the table
    lines = [*notes, head, "|" + "---|" * 14]
    for row in results["rows"]:
        if row["kind"] != COSERVED:
            continue
        inflation = row.get("inflation") or {}
        overruns = (row.get("steps") or {}).get("overrun_share")
        pct = [row.get("pct_measured_ceiling"), row.get("pct_model_ceiling")]
        cells = [
            row["load"],
            row["mix"],
            row["technique"],
            f"{row['knob']:g}",
            _fig(row.get("harvest")),
            _fig(row.get("E"), "{:.2f}"),
            f"{row['alpha_m']:.2f}" if row.get("alpha_m") else "–",
            *(_fig(inflation.get(f"{n}_{q}"), "{:.2f}") for n in LATENCIES for q in QUANTILES),
            " / ".join("–" if p is None else f"{p:.1f} %" for p in pct),
            "–" if overruns is None else f"{100 * overruns:.1f} %",
            "yes" if row["valid"] else "no: " + "; ".join(row["reasons"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [_instant(row) for row in results["rows"] if row.get("step")]
    for row in results["rows"]:
        overruns = (row.get("steps") or {}).get("overrun_share")
        state = "valid" if row["valid"] else "INVALID: " + "; ".join(row["reasons"])
        if row["kind"] == CEILING:
            lines.append(
                f"- ceiling, {row['mix']}: {_fig(row['harvest'])} tokens/s (model's steady ceiling "
                f"{row['model_steady_ceiling']:.0f}); {state}"
            )
        elif row["kind"] == ONLINE_ALONE:
            online = row["online"]
            lines.append(
                f"- online alone, {row['load']} (block {row['mix']}, rep {row['rep']}): TTFT p50 "
                f"{1000 * (online['ttft_p50'] or 0):.0f} ms, TBT p50 {1000 * (online['tbt_p50'] or 0):.1f} ms, "
                f"overruns {'–' if overruns is None else f'{100 * overruns:.1f} %'}; {state}"
            )
    return "\n".join(lines + _aggregate_table(results.get("aggregates") or []))


def _aggregate_table(aggregates: list[dict[str, t.Any]]) -> list[str]:
    """The settings with three or more valid repetitions: their means, each with its Student-t interval."""
    if not aggregates:
        return []
    lines = [
        "",
        "Means over the valid repetitions, each with its 95 % Student-t interval (the bootstrap's in frontier.json); "
        "vLLM alone at the same α_m is its measured curve interpolated, starting at online alone; the ratio's bounds "
        "pair the harvest's interval with α_m's (its low end: the harvest's low over vLLM alone at α_m's high):",
        "",
        "| load | mix | technique | knob | reps | harvest tok/s | E | α_m | TTFT p50× | TTFT p99× | TBT p50× "
        "| TBT p99× | vLLM alone at α_m | ÷ vLLM alone |",
        "|" + "---|" * 14,
    ]
    for agg in aggregates:
        peer = agg.get("peer_harvest")
        cells = [
            agg["load"],
            agg["mix"],
            agg["technique"],
            f"{agg['knob']:g}",
            str(agg["harvest"]["reps"]),
            _t_fig(agg["harvest"]),
            _t_fig(agg["E"], "{:.2f}"),
            _t_fig(agg["alpha_m"], "{:.2f}"),
            *(_t_fig(agg[f"{n}_{q}"], "{:.3f}") for n in LATENCIES for q in QUANTILES),
            "–" if peer is None else f"{peer:.0f}",
            _ratio(agg.get("over_peer")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(_instant_means(agg) for agg in aggregates if "instant_transient" in agg)]
    return lines


def _instant_means(agg: dict[str, t.Any]) -> str:
    """The instant over the repetitions: each span's mean ITL (TTFT) p50 inflation with its Student-t interval."""
    spans = [
        f"{_t_fig(agg[f'instant_{k}'], '{:.3f}')} (TTFT p50 {_t_fig(agg[f'instant_ttft_{k}'], '{:.3f}')})"
        for k in ("transient", "recovered")
    ]
    return (
        f"- the instant over {agg['instant_transient']['reps']} repetitions, {agg['technique']} {agg['knob']:g} "
        f"({agg['load']}, {agg['mix']}): online ITL p50 inflation {spans[0]} over the first {step_response.SETTLE_S:.0f} s "
        f"after the step, {spans[1]} over the {step_response.HOLD_S:.0f} s after that"
    )


def _t_triple(iv: dict[str, t.Any]) -> tuple[float, float | None, float | None]:
    return iv["value"], iv.get("t_low"), iv.get("t_high")


def _ratio(over: dict[str, float | None] | None) -> str:
    """A ratio to vLLM alone with its bounds; an end that cannot be read (efficiency.over_peer) shows as –."""
    if not over or over["value"] is None:
        return "–"
    ends = ["–" if over[k] is None else f"{over[k]:.2f}" for k in ("low", "high")]
    return f"{over['value']:.2f}× [{ends[0]}, {ends[1]}]"


def _t_fig(iv: dict[str, t.Any], fmt: str = "{:.0f}") -> str:
    return _fig({"value": iv.get("value"), "low": iv.get("t_low"), "high": iv.get("t_high")}, fmt)


def plot(report: Report, results: dict[str, t.Any], path: Path) -> Path:
    """Per load and mix: each point's harvest against its α_m, beside the oracle's H*(α); hollow: invalid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r["kind"] == COSERVED]
    panels = sorted({(r["load"], r["mix"]) for r in rows})
    fig, axes = plt.subplots(len(panels) or 1, 1, figsize=(8, 4.2 * max(len(panels), 1)), squeeze=False)
    for ax, (load, mix) in zip(axes[:, 0], panels):
        here = [r for r in rows if (r["load"], r["mix"]) == (load, mix)]
        top = max([2.0, *(1.1 * r["alpha_m"] for r in here if r.get("alpha_m"))])
        alphas = np.unique(np.concatenate([np.linspace(1.0, 1.5, 11), np.geomspace(1.5, top, 12)]))
        rates = report.rates(load)[:: max(1, len(report.rates(load)) // 8)]
        curve = [report.oracles(mix).h_star_over(a, rates) for a in alphas]
        ax.plot(alphas, curve, color="black", lw=1.2, label="H*(α), the oracle")
        for technique in COLOURS:
            mine = sorted(
                (r for r in here if r["technique"] == technique and r.get("alpha_m")), key=lambda r: r["knob"]
            )
            for r in mine:
                h = r["harvest"]
                err = None
                if h["low"] is not None:
                    err = [[h["value"] - h["low"]], [h["high"] - h["value"]]]
                ax.errorbar(
                    r["alpha_m"],
                    h["value"],
                    yerr=err,
                    fmt="o",
                    color=COLOURS[technique],
                    mfc=COLOURS[technique] if r["valid"] else "none",
                    ms=6,
                )
            valid = [r for r in mine if r["valid"]]
            ax.plot(
                [r["alpha_m"] for r in valid],
                [r["harvest"]["value"] for r in valid],
                color=COLOURS[technique],
                lw=0.8,
                label=technique,
            )
        ax.set_xscale("log")
        ax.set_xlabel("α_m: the largest online TTFT / TBT inflation (p50, p99), at least 1.10 (log scale)")
        ax.set_ylabel("batch tokens/s")
        ax.set_title(f"{load}, {mix} batch on {report.plan.profile} (hollow: invalid window)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
