"""Prometheus text pages (vLLM's /metrics, TidalScheduler's, a worker's, the API's): one fetch, one walk.

The gate reads vLLM's page through these (``gate.parse_metrics`` adds its own checks), so fetching a page and
summing its series over label sets is written once.
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
