"""The fleet benchmark's pure parts: the arms and their order, the static split, the per-bin batch fill and its
correlation with the online rate, and the figures (with intervals) computed from fleet.json's arm records.

Every figure is one value per repetition, reduced by stats.bootstrap (mean, 95 % interval, refused under three
repetitions); a ratio whose interval spans 1.0 reads "no measurable change". The design's figures stand beside
them.
"""

from __future__ import annotations

import collections
import itertools
import math
import typing as t

from tidal_workers.bench import samples
from tidal_workers.bench.stats import Interval
from tidal_workers.bench.stats import TooFewRepetitions
from tidal_workers.bench.stats import abba_order
from tidal_workers.bench.stats import bootstrap
from tidal_workers.bench.stats import figure_text
from tidal_workers.bench.stats import ratio_text

BASELINE = "baseline"  # online load only: each replica's own reference for inflation
PLACEMENT = "placement"  # one worker per replica, each with its own gate, all claiming from one queue
SPLIT = "split"  # the same batch cut in two halves, each half on its own Tidal with one worker per replica
PINNING = "pinning"  # the whole batch on one worker, on replica 0 (the design's comparison)
ARMS = (BASELINE, PLACEMENT, SPLIT, PINNING)
BATCH_ARMS = (PLACEMENT, SPLIT, PINNING)

# The design's fleet figures (two replicas, period 600 s): placement against pinning, batch items per replica,
# r of batch fill against the online rate per replica. It did not measure a static split.
DESIGN_PLACEMENT_VS_PINNING_PCT = 32.0
DESIGN_ITEMS = (1239, 1255)
DESIGN_R = (-0.83, -0.56)

LATENCY_KEYS = [f"{name}_{q}" for name in ("ttft", "tbt") for q in samples.QUANTILES]

Record = dict[str, t.Any]


def arm_order(reps: int, batch_arms: t.Sequence[str] = BATCH_ARMS) -> list[tuple[int, str]]:
    """(repetition, arm) in the order to run them: the baseline and ``batch_arms`` (in ARMS order) forwards, then
    backwards, and so on (ABBA)."""
    return abba_order([arm for arm in ARMS if arm == BASELINE or arm in batch_arms], reps)


def arms_run(arms: list[dict]) -> list[str]:
    """The batch arms present in a run's records, in ARMS order (a run may leave some out: ``--arms``)."""
    present = {a["arm"] for a in arms}
    return [arm for arm in BATCH_ARMS if arm in present]


def split_evenly(items: t.Sequence[t.Any], parts: int) -> list[list[t.Any]]:
    """``items`` cut into ``parts`` contiguous runs whose lengths differ by at most one (the first ones longer)."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def interp(xs: t.Sequence[float], ys: t.Sequence[float], x: float) -> float:
    """A counter's value at ``x``, linear between readings, held flat beyond them."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in itertools.pairwise(zip(xs, ys)):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return ys[-1]


def online_tokens_between(records: t.Iterable[Record], lo: float, hi: float) -> int:
    """Online tokens generated in [lo, hi) seconds after the phase opened, from the client's per-chunk counts."""
    records = list(records)
    return samples.tokens_until(records, hi) - samples.tokens_until(records, lo)


def batch_series(
    at: t.Sequence[float], generated: t.Sequence[float], records: list[Record], span: float, interval: float
) -> list[tuple[float, float]]:
    """(bin midpoint, batch tokens/s) per ``interval`` over [0, span): the engine's generated tokens in the bin
    (its counter read at times ``at``, seconds after the phase opened) minus the online requests' tokens in it."""
    edges = [k * interval for k in range(int(span // interval) + 1)]
    out = []
    for lo, hi in itertools.pairwise(edges):
        engine = interp(at, generated, hi) - interp(at, generated, lo)
        out.append(((lo + hi) / 2, (engine - online_tokens_between(records, lo, hi)) / interval))
    return out


def pearson(xs: t.Sequence[float], ys: t.Sequence[float]) -> float | None:
    """Pearson r; None under three points or when either side is constant (no batch work at all)."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def arrived_before(records: t.Iterable[Record], until: float) -> list[Record]:
    """The online requests scheduled before ``until``: the ones that met the batch while it had work."""
    return [r for r in records if r["at"] < until]


def inflation(arm: list[Record], baseline: list[Record], until: float) -> dict[str, float | None]:
    """Per latency percentile: the arm's over the baseline's, both over the same scheduled requests (the online
    schedule is the same in every arm of a repetition) arriving before ``until``."""
    mine = samples.summary(arrived_before(arm, until))
    base = samples.summary(arrived_before(baseline, until))
    out: dict[str, float | None] = {}
    for key in LATENCY_KEYS:
        a, b = mine[key], base[key]
        out[key] = a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else None
    return out


def per_rep(arms: list[dict]) -> dict[str, list[float]]:
    """{figure: [one value per repetition]}: harvest per arm and its ratios, makespans, per-replica inflation and
    r, online load sustained and engine CPU. Only repetitions with every arm present count."""
    by = {(a["rep"], a["arm"]): a for a in arms}
    batch_arms = arms_run(arms)
    reps = sorted({rep for rep, _ in by if all((rep, arm) in by for arm in (BASELINE, *batch_arms))})
    out: dict[str, list[float]] = collections.defaultdict(list)
    for rep in reps:
        harvest = {arm: by[(rep, arm)]["batch_tokens_per_s"] for arm in batch_arms}
        for arm, value in harvest.items():
            out[f"harvest_{arm}"].append(value)
            if by[(rep, arm)]["makespan_s"] is not None:
                out[f"makespan_{arm}_s"].append(by[(rep, arm)]["makespan_s"])
        for other in (SPLIT, PINNING):
            if PLACEMENT in harvest and harvest.get(other, 0) > 0:
                out[f"placement_vs_{other}"].append(harvest[PLACEMENT] / harvest[other])
        base = by[(rep, BASELINE)]
        for i, replica in enumerate(base["replicas"]):
            out[f"online_answered_per_s_{i}"].append(replica["answered_per_s"])
            out[f"online_offered_per_s_{i}"].append(replica["offered_per_s"])
            out[f"engine_cpu_cores_{i}_baseline"].append(replica["cpu_cores"])
        for arm in batch_arms:
            for i, replica in enumerate(by[(rep, arm)]["replicas"]):
                out[f"engine_cpu_cores_{i}_{arm}"].append(replica["cpu_cores"])
                out[f"batch_share_{i}_{arm}"].append(replica["batch_tokens"])
                if replica["r"] is not None:
                    out[f"r_{i}_{arm}"].append(replica["r"])
                for key, value in replica["inflation"].items():
                    if value is not None:
                        out[f"inflation_{key}_{i}_{arm}"].append(value)
    return out


def intervals(arms: list[dict]) -> dict[str, dict]:
    """The JSON summary: per figure, its values per repetition and their interval, or the refusal."""
    out: dict[str, dict] = {}
    for name, values in per_rep(arms).items():
        entry: dict[str, t.Any] = {"per_rep": values}
        try:
            entry["interval"] = bootstrap(values).as_dict()
        except TooFewRepetitions as exc:
            entry["refused"] = str(exc)
        out[name] = entry
    return out


def _num(fmt: str) -> t.Callable[[Interval], str]:
    return lambda iv: f"{iv.value:{fmt}} [{iv.low:{fmt}}, {iv.high:{fmt}}]"


def table(arms: list[dict], replicas: int = 2) -> str:
    """The report as a docs/results report carries it (Markdown), the design's figures in the last column."""
    figures = per_rep(arms)
    ran = arms_run(arms)
    lines = ["| figure | placement | static split | pinning (replica 0) | design |", "|---|---|---|---|---|"]

    def cells(key: str, fmt: t.Callable[[Interval], str]) -> list[str]:
        return [
            figure_text(figures.get(key.format(arm=arm), []), fmt) if arm in ran else "not run" for arm in BATCH_ARMS
        ]

    def row(label: str, values: list[str], design: str = "") -> None:
        lines.append(f"| {label} | " + " | ".join(values) + f" | {design} |")

    row("batch tokens/s while the batch had work", cells("harvest_{arm}", _num(".0f")))
    row("makespan of the batch, s (finished runs)", cells("makespan_{arm}_s", _num(".0f")))
    vs = [
        figure_text(figures.get(f"placement_vs_{o}", []), ratio_text) if {PLACEMENT, o} <= set(ran) else "not run"
        for o in (SPLIT, PINNING)
    ]
    row("placement ÷ arm, batch tokens/s", ["—", *vs], f"+{DESIGN_PLACEMENT_VS_PINNING_PCT:.0f} % vs pinning")
    for i in range(replicas):
        row(f"replica {i}: batch tokens", cells(f"batch_share_{i}_{{arm}}", _num(".0f")), f"{DESIGN_ITEMS[i]} items")
        row(f"replica {i}: r (batch fill vs online rate)", cells(f"r_{i}_{{arm}}", _num("+.2f")), f"{DESIGN_R[i]}")
        for key in LATENCY_KEYS:
            label = f"replica {i}: online {key.replace('_', ' ')} ÷ its baseline"
            row(label, cells(f"inflation_{key}_{i}_{{arm}}", ratio_text))
        row(f"replica {i}: engine CPU, cores", cells(f"engine_cpu_cores_{i}_{{arm}}", _num(".2f")))
    for i in range(replicas):
        offered = figure_text(figures.get(f"online_offered_per_s_{i}", []), _num(".2f"))
        answered = figure_text(figures.get(f"online_answered_per_s_{i}", []), _num(".2f"))
        cpu = figure_text(figures.get(f"engine_cpu_cores_{i}_baseline", []), _num(".2f"))
        label = f"replica {i}, online only: offered / answered req/s; engine CPU, cores"
        row(label, [f"{offered} / {answered}; {cpu}", "", ""])
    return "\n".join(lines)
