"""Prometheus text pages (vLLM's /metrics, TidalScheduler's, a worker's, the API's): one fetch, one walk.

The gate reads vLLM's page through these (``gate.parse_metrics`` adds its own checks), and so do
the benchmarks' samplers, so fetching a page and summing its series over label sets is written once.
"""

from __future__ import annotations

import typing as t

import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def fetch(url: str, timeout: float, session: requests.Session | None = None) -> str:
    """GET a /metrics page; raises requests' errors, and ``requests.HTTPError`` for any status but 200."""
    resp = (session or requests).get(url, timeout=timeout)
    if resp.status_code != 200:
        raise requests.HTTPError(f"{url} answered HTTP {resp.status_code}", response=resp)
    return resp.text


def samples(text: str) -> t.Iterator[Sample]:
    """Every sample on the page, in order. Text that is not an exposition raises (ValueError and others)."""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def totals(text: str, names: t.Container[str] | None = None) -> dict[str, float]:
    """Sample name -> its values summed over label sets (every engine and model on the page); only ``names``."""
    out: dict[str, float] = {}
    for sample in samples(text):
        if names is None or sample.name in names:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def named_totals(text: str, names: t.Collection[str]) -> dict[str, float]:
    """``totals`` of ``names`` only (0 for one the page lacks), found by each line's name; the other lines are
    skipped unparsed and nothing is validated. What a benchmark's sampler reads several times a second: the full
    parse of vLLM's page cost the dispatch benchmark a third of a core on the two it shares with what it measures."""
    values = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in values:  # `name{labels} value [timestamp]` or `name value [timestamp]`
            rest = line.rpartition("}")[2] if "{" in line else line.partition(" ")[2]
            values[name] += float(rest.split()[0])
    return values


def read_totals(url: str, names: t.Container[str] | None = None, timeout: float = 2.0) -> dict[str, float]:
    """``totals`` of the page at ``url``: what a sampler reads each period."""
    return totals(fetch(url, timeout), names)
