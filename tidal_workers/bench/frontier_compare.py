"""Two frontier runs point by point: each figure of one run over the same figure of the other, with a 95 % interval.

For the time-scale check (issue 35, item 8: the same plan at ``--time-scale 2`` over ``--time-scale 1``; a figure
the CPU does not bend keeps its ratio inside [0.9, 1.1]) and for a change to a technique run as two whole runs.
Points pair by name (load, mix, technique, knob, repetition). Per co-served pair:

- harvest (in the GPU's seconds): the two windows' rates over each other, each window's blocks resampled on their
  own (two windows share no blocks);
- each latency inflation (TTFT and TBT at p50 and p99): (arm's point ÷ arm's online alone) ÷ (base's point ÷ base's
  online alone). All four windows send the same trace's first requests (the plan seeds every arm alike, and a time
  scale only stretches the arrivals), so the requests are resampled jointly across the four and the correlation
  through the shared requests stays in the interval.

Per online-alone pair: each latency in the GPU's seconds, arm ÷ base, the requests resampled jointly. Pure: two
``Report``s in, a dict out.
"""

from __future__ import annotations

import typing as t

from tidal_workers.bench import samples
from tidal_workers.bench import stats
from tidal_workers.bench import steady
from tidal_workers.bench.frontier_plan import COSERVED
from tidal_workers.bench.frontier_plan import ONLINE_ALONE
from tidal_workers.bench.frontier_report import LATENCIES
from tidal_workers.bench.frontier_report import QUANTILES
from tidal_workers.bench.frontier_report import Record
from tidal_workers.bench.frontier_report import Report
from tidal_workers.bench.frontier_report import verdict
from tidal_workers.bench.frontier_report import window_samples

TOLERANCE = 0.10  # item 8: a ratio's interval inside [0.9, 1.1]


def compare(base: Report, arm: Report, tolerance: float = TOLERANCE) -> list[dict[str, t.Any]]:
    """One entry per point measured in both runs (co-served and online alone), in the arm's plan order."""
    entries = []
    for name in (p.name for p in arm.plan.points()):
        other, record = base.by_name.get(name), arm.by_name.get(name)
        if other is None or record is None:
            continue
        kind = record["point"]["kind"]
        if kind == COSERVED:
            figures = _coserved(base, other, arm, record)
        elif kind == ONLINE_ALONE:
            figures = _online_alone(base, other, arm, record)
        else:
            continue  # the ceiling: no online traffic to compare, and only the "% of ceiling" column rests on it
        entries.append(
            {
                "name": name,
                "valid": {"base": _valid(base, other), "arm": _valid(arm, record)},
                "figures": {k: _judged(v, tolerance) for k, v in figures.items()},
            }
        )
    return entries


def table(entries: list[dict[str, t.Any]], tolerance: float = TOLERANCE) -> str:
    """The comparison as a markdown table: one row per point and figure."""
    lines = [
        f"| point | figure | arm ÷ base [95 %] | within ±{100 * tolerance:.0f} % | valid (base / arm) |",
        "|---|---|---|---|---|",
    ]
    for entry in entries:
        valid = " / ".join("yes" if v else "no" for v in entry["valid"].values())
        for figure, judged in entry["figures"].items():
            if judged is None:
                lines.append(f"| {entry['name']} | {figure} | none | — | {valid} |")
                continue
            ratio = f"{judged['value']:.3f} [{judged['low']:.3f}, {judged['high']:.3f}]"
            lines.append(f"| {entry['name']} | {figure} | {ratio} | {'yes' if judged['within'] else 'no'} | {valid} |")
    return "\n".join(lines)


def _valid(report: Report, record: Record) -> bool:
    point = record["point"]
    baseline = report.baseline(point) if point["kind"] == COSERVED else None
    return verdict(record, report.plan, baseline).valid


def _coserved(base: Report, base_record: Record, arm: Report, arm_record: Record) -> dict[str, stats.Interval | None]:
    figures: dict[str, stats.Interval | None] = {"harvest": _harvest_ratio(base, base_record, arm, arm_record)}
    base_alone, arm_alone = base.baseline(base_record["point"]), arm.baseline(arm_record["point"])
    if base_alone is None or arm_alone is None:
        return figures | {f"{n}_{q}_inflation": None for n in LATENCIES for q in QUANTILES}
    windows = [samples.per_request(r["online"]["records"]) for r in (base_alone, base_record, arm_alone, arm_record)]
    for name in LATENCIES:
        n = min(len(w[name]) for w in windows)  # the trace's first n requests, sent in all four windows
        ratios = stats.paired_quantile_products(
            [w[name][:n] for w in windows], [1, -1, -1, 1], list(QUANTILES.values())
        )
        figures.update({f"{name}_{q}_inflation": r for q, r in zip(QUANTILES, ratios, strict=True)})
    return figures


def _harvest_ratio(base: Report, base_record: Record, arm: Report, arm_record: Record) -> stats.Interval | None:
    """Arm's harvest ÷ base's, each in the GPU's seconds (a run k times slower harvests k times less a wall
    second)."""
    cuts = []
    for record in (arm_record, base_record):
        window = window_samples(record)
        if len(window) < 2:
            return None
        cuts.append(steady.blocks(window))
    rates = [float(c.generated.sum() / c.seconds.sum()) for c in cuts]
    if rates[1] <= 0:
        return None
    scale = arm.plan.time_scale / base.plan.time_scale
    bounds = steady.ratio_of_ratios_interval((cuts[0].generated, cuts[0].seconds), (cuts[1].generated, cuts[1].seconds))
    if bounds is None:
        return None
    return stats.Interval(scale * rates[0] / rates[1], scale * bounds[0], scale * bounds[1], len(cuts[0].seconds))


def _online_alone(
    base: Report, base_record: Record, arm: Report, arm_record: Record
) -> dict[str, stats.Interval | None]:
    """Each latency of online alone in the GPU's seconds, arm ÷ base."""
    windows = [samples.per_request(r["online"]["records"]) for r in (base_record, arm_record)]
    scale = base.plan.time_scale / arm.plan.time_scale  # arm's wall seconds ÷ its k, over base's ÷ its k
    figures: dict[str, stats.Interval | None] = {}
    for name in LATENCIES:
        n = min(len(w[name]) for w in windows)
        ratios = stats.paired_quantile_ratios(windows[0][name][:n], windows[1][name][:n], list(QUANTILES.values()))
        figures.update(
            {
                f"{name}_{q}": stats.Interval(scale * r.value, scale * r.low, scale * r.high, r.reps) if r else None
                for q, r in zip(QUANTILES, ratios, strict=True)
            }
        )
    return figures


def _judged(ratio: stats.Interval | None, tolerance: float) -> dict[str, t.Any] | None:
    if ratio is None:
        return None
    within = 1 - tolerance <= ratio.low and ratio.high <= 1 + tolerance
    return {**ratio.as_dict(), "within": within}
