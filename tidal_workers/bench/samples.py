"""Latencies from the online client's raw records (``client.Record`` as JSON dicts), all measured from the
scheduled arrival. Pure: the report recomputes every figure from harvest.json's raw records with these."""

from __future__ import annotations

import typing as t

from tidal_workers.bench.stats import percentile

Record = dict[str, t.Any]  # client.Record as stored: at, late, chunks [[s, tokens so far], ...], error


def ok(records: t.Iterable[Record]) -> list[Record]:
    return [r for r in records if r["error"] is None and r["chunks"]]


def ttfts(records: t.Iterable[Record]) -> list[float]:
    return [r["chunks"][0][0] for r in ok(records)]


def e2es(records: t.Iterable[Record]) -> list[float]:
    return [r["chunks"][-1][0] for r in ok(records)]


def tbts(records: t.Iterable[Record]) -> list[float]:
    """Time between tokens: a gap before a chunk carrying k tokens counts as k gaps of a k-th of it each."""
    out = []
    for r in ok(records):
        for (t0, n0), (t1, n1) in zip(r["chunks"], r["chunks"][1:]):
            out += [(t1 - t0) / (n1 - n0)] * (n1 - n0)
    return out


def lateness(records: t.Iterable[Record]) -> list[float]:
    return [r["late"] for r in records]


def tokens_until(records: t.Iterable[Record], until: float) -> int:
    """Online tokens generated before ``until`` seconds after the phase opened (the window's end)."""
    total = 0
    for r in ok(records):
        done = [n for s, n in r["chunks"] if r["at"] + s <= until]
        total += done[-1] if done else 0
    return total


LATENCIES: dict[str, t.Callable[[t.Iterable[Record]], list[float]]] = {"ttft": ttfts, "tbt": tbts, "e2e": e2es}
QUANTILES = {"p50": 0.5, "p99": 0.99}


def summary(records: list[Record]) -> dict[str, float | int | None]:
    """Counts and the p50 / p99 of each latency (seconds) for one phase."""
    out: dict[str, float | int | None] = {
        "requests": len(records),
        "errors": len(records) - len(ok(records)),
        "late_p99": percentile(lateness(records), 0.99),
    }
    for name, fn in LATENCIES.items():
        values = fn(records)
        out[f"{name}_samples"] = len(values)
        for label, q in QUANTILES.items():
            out[f"{name}_{label}"] = percentile(values, q)
    return out
