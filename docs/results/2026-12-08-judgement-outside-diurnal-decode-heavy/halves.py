"""The diurnal window in two halves: online inflation and the batch at the engine where the rate is below the 5/s
mean (the trough half) and above it (the peak half). Each co-served window's requests are paired with the same
repetition's online-alone window (both sent the same trace) and read with the report's own functions
(bench.samples, bench.stats.percentile). Run from the repository root: python
docs/results/2026-12-08-judgement-outside-diurnal-decode-heavy/halves.py [FOLDER] (this folder by default)."""

from __future__ import annotations

import glob
import json
import lzma
import statistics
import sys
from pathlib import Path

from tidal_workers.bench import samples
from tidal_workers.bench.online import diurnal
from tidal_workers.bench.stats import percentile

RATE = diurnal(5.0, 0.8, 600.0)  # diurnal-5 (bench.workload), its phase starting at the window's opening


def half_of(at: float) -> str:
    return "peak" if RATE(at) >= 5.0 else "trough"


def load(path: str) -> dict:
    with lzma.open(path) if path.endswith(".xz") else open(path, "rb") as f:
        return json.loads(f.read())


def inflations(co: list[dict], alone: list[dict]) -> list[float]:
    """TTFT p50, p99 and TBT p50, p99 of ``co`` over the same of ``alone``."""
    pairs = ((samples.ttfts(co), samples.ttfts(alone)), (samples.tbts(co), samples.tbts(alone)))
    return [percentile(a, q) / percentile(b, q) for a, b in pairs for q in (0.5, 0.99)]


def main(folder: Path) -> None:
    points = {Path(p).name.split(".json")[0]: p for p in glob.glob(str(folder / "points" / "*.json*"))}
    print("| point | half | requests | batch at the engine (median) | TTFT p50× | TTFT p99× | TBT p50× | TBT p99× |")
    print("|---|---|---|---|---|---|---|---|")
    for name in sorted(n for n in points if n.startswith("coserved")):
        rep = name.rsplit("__", 1)[1]
        alone = next(p for n, p in points.items() if n.startswith("online-alone") and n.endswith(rep))
        co, base = load(points[name]), load(alone)
        opens, closes = co["window"]["opens"], co["window"]["closes"]
        for half in ("trough", "peak"):
            ours = [r for r in co["online"]["records"] if half_of(r["at"]) == half]
            theirs = [r for r in base["online"]["records"] if half_of(r["at"]) == half]
            series = [s for s in co["series"] if opens <= s["at"] <= closes and half_of(s["at"] - opens) == half]
            engine = statistics.median(s["at_engine"] for s in series)
            cells = [name.split("__", 3)[-1], half, str(len(samples.ok(ours))), f"{engine:g}"]
            print("| " + " | ".join(cells + [f"{x:.3f}" for x in inflations(ours, theirs)]) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
