"""Latencies from the online client's raw records (``client.Record`` as JSON dicts), all measured from the
scheduled arrival. Pure: the report recomputes every figure from harvest.json's raw records with these."""

from __future__ import annotations

import typing as t

import numpy as np

from tidal_workers.bench.stats import percentile

Record = dict[str, t.Any]  # client.Record as stored: at, late, chunks [[s, tokens so far], ...], error


def ok(records: t.Iterable[Record]) -> list[Record]:
    return [r for r in records if r["error"] is None and r["chunks"]]


def ttfts(records: t.Iterable[Record]) -> list[float]:
    return [r["chunks"][0][0] for r in ok(records)]


def e2es(records: t.Iterable[Record]) -> list[float]:
    return [r["chunks"][-1][0] for r in ok(records)]


def record_token_gaps(record: Record) -> list[tuple[float, float]]:
    """One request's tokens after its first: (when it came, seconds after arrival; the gap before it). A gap before
    a chunk carrying k tokens counts as k gaps of a k-th of it, each at the chunk's time."""
    out = []
    for (t0, n0), (t1, n1) in zip(record["chunks"], record["chunks"][1:]):
        out += [(t1, (t1 - t0) / (n1 - n0))] * (n1 - n0)
    return out


def record_tbts(record: Record) -> list[float]:
    """One request's times between tokens (``record_token_gaps`` without their times)."""
    return [gap for _, gap in record_token_gaps(record)]


def tbts(records: t.Iterable[Record]) -> list[float]:
    return [gap for r in ok(records) for gap in record_tbts(r)]


def per_request(records: t.Sequence[Record]) -> dict[str, list[list[float]]]:
    """Each request's TTFT (one value, none if it failed) and its TBTs, in the records' order: the samples a paired
    comparison of two arms sending the same trace resamples request by request."""
    answered = [r["error"] is None and bool(r["chunks"]) for r in records]
    return {
        "ttft": [[r["chunks"][0][0]] if a else [] for r, a in zip(records, answered, strict=True)],
        "tbt": [record_tbts(r) if a else [] for r, a in zip(records, answered, strict=True)],
    }


def cumulative_tokens(
    records: t.Iterable[Record], opens: float, times: t.Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Online prompt tokens and generated tokens summed over ``records`` (whose trace opened at the monotonic
    instant ``opens``) up to each of ``times``: a prompt counted when its first token came, as vLLM's
    prompt-token counter counts it. Subtracted from the engine's counters, they leave the batch's."""
    prompt_at, prompt, gen_at, gen = [], [], [], []
    for r in records:
        due = opens + r["at"]
        if r["chunks"]:
            prompt_at.append(due + r["chunks"][0][0])
            prompt.append(r["prompt_tokens"])
        before = 0
        for s, n in r["chunks"]:
            gen_at.append(due + s)
            gen.append(n - before)
            before = n

    def totals(at: list[float], amount: list[float]) -> np.ndarray:
        order = np.argsort(at)
        cum = np.concatenate([[0.0], np.cumsum(np.asarray(amount, float)[order])])
        return cum[np.searchsorted(np.asarray(at, float)[order], np.asarray(times, float), side="right")]

    return totals(prompt_at, prompt), totals(gen_at, gen)


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
