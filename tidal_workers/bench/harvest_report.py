"""The harvest benchmark's figures, table and plots, all computed from harvest.json's phase records.

Every harvest and inflation figure is one value per repetition, reduced by stats.bootstrap: the mean with a 95 %
interval, refused under three repetitions; an inflation ratio whose interval spans 1.0 reads "no measurable
change". The seed's figures stand beside them for comparison.
"""

from __future__ import annotations

import collections
import typing as t
from pathlib import Path

from tidal_workers.bench import samples
from tidal_workers.bench.stats import Interval
from tidal_workers.bench.stats import TooFewRepetitions
from tidal_workers.bench.stats import bootstrap
from tidal_workers.bench.stats import figure_text
from tidal_workers.bench.stats import ratio_text

# The seed's testbed (Qwen2.5-7B on an RTX A6000): harvest as a share of the ceiling, and online latency p50 / p99
# inflation, flat 20 requests/s and diurnal at 12.1 requests/s mean.
SEED = {"harvest_pct": {"flat": 69.3, "diurnal": 78.1}, "inflation": {"p50": 1.18, "p99": 1.23}}
LATENCY_KEYS = [f"{name}_{q}" for name in samples.LATENCIES for q in samples.QUANTILES]

Phases = list[dict[str, t.Any]]
# The reports before issue 35 named the techniques A and B; read so, they get today's names.
LEGACY_TECHNIQUES = {"A": "outside", "B": "inside"}
COLOURS = {"outside": "tab:blue", "inside": "tab:orange"}


def technique_of(phase: dict[str, t.Any]) -> str:
    return LEGACY_TECHNIQUES.get(phase["technique"], phase["technique"])


def _by(phases: Phases, name: str) -> dict[tuple, dict]:
    return {(p["rep"], technique_of(p), p["trace"]): p for p in phases if p["phase"] == name}


def per_rep(phases: Phases) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{technique: {trace: {figure: [one value per repetition]}}}: harvest %, inflation and absolute latencies."""
    ceilings = _by(phases, "ceiling")
    bases = _by(phases, "baseline")
    out: dict = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    for (rep, technique, trace), co in sorted(_by(phases, "coserved").items()):
        ceiling = ceilings[(rep, technique, None)]["batch_tokens_per_s"]
        base = bases[(rep, technique, trace)]["summary"]
        figures = out[technique][trace]
        figures["harvest_pct"].append(100 * co["batch_tokens_per_s"] / ceiling)
        for key in LATENCY_KEYS:
            if co["summary"][key] is not None and base[key]:
                figures[f"inflation_{key}"].append(co["summary"][key] / base[key])
            figures[f"baseline_{key}_ms"].append(1000 * (base[key] or 0.0))
            figures[f"coserved_{key}_ms"].append(1000 * (co["summary"][key] or 0.0))
    return out


def intervals(phases: Phases) -> dict:
    """The JSON summary: per figure, the values per repetition and their interval, or the refusal."""
    out: dict = {}
    for technique, traces in per_rep(phases).items():
        for trace, figures in traces.items():
            for name, values in figures.items():
                entry: dict[str, t.Any] = {"per_rep": values}
                try:
                    entry["interval"] = bootstrap(values).as_dict()
                except TooFewRepetitions as exc:
                    entry["refused"] = str(exc)
                out.setdefault(technique, {}).setdefault(trace, {})[name] = entry
    return out


def _pct(iv: Interval) -> str:
    return f"{iv.value:.1f} % [{iv.low:.1f}, {iv.high:.1f}]"


def _ms(iv: Interval) -> str:
    return f"{iv.value:.0f} ms [{iv.low:.0f}, {iv.high:.0f}]"


def table(phases: Phases) -> str:
    """The report as a docs/results report carries it (Markdown), beside the seed's figures."""
    figures = per_rep(phases)
    columns = [(tech, trace) for tech in sorted(figures) for trace in ("flat", "diurnal") if trace in figures[tech]]
    header = "| figure | " + " | ".join(f"{tech}, {trace}" for tech, trace in columns) + " | seed |"
    lines = [header, "|---" * (len(columns) + 2) + "|"]

    def row(label: str, key: str, fmt: t.Callable[[Interval], str], seed: str) -> None:
        cells = [figure_text(figures[tech][trace].get(key, []), fmt) for tech, trace in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {seed} |")

    flat, diurnal = SEED["harvest_pct"]["flat"], SEED["harvest_pct"]["diurnal"]
    row("harvest, % of the ceiling", "harvest_pct", _pct, f"{flat} % flat, {diurnal} % diurnal")
    for key in LATENCY_KEYS:
        quantile = key.rsplit("_", 1)[1]
        seed = f"{SEED['inflation'][quantile]}× (online {quantile})"
        row(f"{key.replace('_', ' ')} inflation", f"inflation_{key}", ratio_text, seed)
    for key in LATENCY_KEYS:
        for phase in ("baseline", "coserved"):
            row(f"{key.replace('_', ' ')}, {phase}", f"{phase}_{key}_ms", _ms, "")
    if "outside" in figures and "inside" in figures:
        lines.append("")
        for trace in ("flat", "diurnal"):
            a, b = figures["outside"].get(trace, {}), figures["inside"].get(trace, {})
            if "harvest_pct" in a and "harvest_pct" in b:
                paired = [y / x for x, y in zip(a["harvest_pct"], b["harvest_pct"]) if x]
                lines.append(f"inside ÷ outside harvest, {trace} (same repetition): {figure_text(paired, ratio_text)}")
    return "\n".join(lines)


def plot(phases: Phases, out_dir: Path) -> list[Path]:
    """Fill over time against the online rate (co-served phases), and online latency CDFs; returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = sorted({p["trace"] for p in phases if p["trace"]}, reverse=True)  # flat, diurnal
    ceilings = _by(phases, "ceiling")
    fig, axes = plt.subplots(len(traces), 1, figsize=(9, 3.6 * len(traces)), squeeze=False)
    for ax, trace in zip(axes[:, 0], traces):
        rate_ax = ax.twinx()
        for (rep, technique, tr), phase in sorted(_by(phases, "coserved").items()):
            if tr != trace or not phase["generation_rate"]:
                continue
            ceiling = ceilings[(rep, technique, None)]["batch_tokens_per_s"]
            xs, ys = zip(*phase["generation_rate"])
            label = f"{technique}" if rep == 0 else None
            ax.plot(xs, [100 * y / ceiling for y in ys], color=COLOURS.get(technique), lw=1, alpha=0.8, label=label)
            if technique == "outside" and rep == 0:
                arrivals = collections.Counter(int(r["at"]) for r in phase["records"])
                seconds = range(int(phase["window_s"]) + 1)
                shifted = [s + phase.get("opens_at_s", 0.0) for s in seconds]  # onto the series' clock
                rate_ax.plot(shifted, [arrivals.get(s, 0) for s in seconds], color="grey", lw=0.8, ls=":")
                ax.axvspan(shifted[0], shifted[0] + phase["window_s"], color="grey", alpha=0.08)
        ax.axhline(100, color="grey", lw=0.6)
        ax.set_ylabel("generated tokens/s, % of ceiling")
        rate_ax.set_ylabel("online arrivals/s (dotted)")
        ax.set_title(f"{trace}: fill over time, co-served (every repetition; shaded: the measured window)")
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("seconds into the phase")
    fig.tight_layout()
    fill_path = out_dir / "harvest_fill.png"
    fig.savefig(fill_path, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(len(traces), 3, figsize=(13, 3.6 * len(traces)), squeeze=False)
    for row, trace in zip(axes, traces):
        pooled: dict[str, list[dict]] = collections.defaultdict(list)
        for p in phases:
            if p["trace"] == trace and p["phase"] != "ceiling":
                pooled[f"{technique_of(p)} {p['phase']}"] += p["records"]
        for ax, (name, fn) in zip(row, samples.LATENCIES.items()):
            for label, records in sorted(pooled.items()):
                values = sorted(1000 * v for v in fn(records) if v > 0)
                if values:
                    ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label, lw=1)
            ax.set_xscale("log")
            ax.set_xlabel(f"online {name.upper()} (ms, from the scheduled arrival), {trace}")
            ax.set_ylabel("CDF")
            ax.legend(fontsize=7)
    fig.tight_layout()
    cdf_path = out_dir / "harvest_latency_cdf.png"
    fig.savefig(cdf_path, dpi=110)
    plt.close(fig)
    return [fill_path, cdf_path]
