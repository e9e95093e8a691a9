"""The worker's dispatch histograms, read from its /metrics page: deltas over a window, percentiles, shares.

``tidal bench dispatch`` and ``tidal bench harvest`` record them (issue 17): engine token freed → next POST
sent, the POST itself, POST end → lease released.
"""

from __future__ import annotations

import typing as t

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

POST = "tidal_dispatch_post_seconds"
HISTOGRAMS = ("tidal_dispatch_token_to_post_seconds", POST, "tidal_dispatch_release_seconds")


def _samples(metrics_text: str, suffix: str) -> t.Iterator[tuple[str, Sample]]:
    """(histogram name, sample) for each of HISTOGRAMS' samples named ``<name><suffix>`` on a /metrics page."""
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            name = s.name.removesuffix(suffix)
            if s.name.endswith(suffix) and name in HISTOGRAMS:
                yield name, s


def buckets(metrics_text: str) -> dict[str, list[tuple[float, float]]]:
    """Histogram name -> cumulative (upper bound, count) pairs, from a worker's /metrics page."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in HISTOGRAMS}
    for name, s in _samples(metrics_text, "_bucket"):
        out[name].append((float(s.labels["le"]), s.value))
    return {name: sorted(pairs) for name, pairs in out.items()}


def sums(metrics_text: str) -> dict[str, float]:
    """Histogram name -> its running sum of observed seconds (``<name>_sum``), from a worker's /metrics page.

    For ``tidal_dispatch_post_seconds`` two readings' difference over the time between them is the node's mean of
    batch POSTs sent and not answered (its requests at the engine, as issue 17 defines them): each POST counts in
    the window it ends in, which is unbiased in a steady flow and off by at most one POST per slot at the edges.
    """
    out = dict.fromkeys(HISTOGRAMS, 0.0)
    for name, s in _samples(metrics_text, "_sum"):
        out[name] = s.value
    return out


def delta(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    earlier = dict(before)
    return [(le, count - earlier.get(le, 0.0)) for le, count in after]


def quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile by linear interpolation inside the histogram's buckets (Prometheus's histogram_quantile)."""
    total = cumulative[-1][1] if cumulative else 0.0
    if total <= 0:
        return None
    rank, lo, below = q * total, 0.0, 0.0
    for le, count in cumulative:
        if count >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(count - below, 1e-12)
        lo, below = le, count
    return lo


def at_most(cumulative: list[tuple[float, float]], bound: float) -> float | None:
    """Share of observations at or under ``bound`` (a bucket edge): exact where the percentile is interpolated."""
    total = cumulative[-1][1] if cumulative else 0.0
    counts = dict(cumulative)
    return counts[bound] / total if total > 0 and bound in counts else None


def summarize_histogram(cumulative: list[tuple[float, float]]) -> dict[str, float | None]:
    return {
        "count": cumulative[-1][1] if cumulative else 0.0,
        "p50_s": quantile(cumulative, 0.5),
        "p90_s": quantile(cumulative, 0.9),
        "p99_s": quantile(cumulative, 0.99),
        "share_le_5ms": at_most(cumulative, 0.005),
        "share_le_50ms": at_most(cumulative, 0.05),
    }
