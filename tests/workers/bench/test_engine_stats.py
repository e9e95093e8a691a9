"""The benchmarks' sampler of vLLM's /metrics (tidal_workers.bench.engine_stats): its line reader agrees with
Prometheus' parser, and its thread reads on its clock and once more on leaving."""

from __future__ import annotations

import itertools

import pytest
import requests

from tests.support.wait import wait_for
from tidal_workers.bench import engine_stats
from tidal_workers.bench.engine_stats import named_totals
from tidal_workers.scrape import fetch
from tidal_workers.scrape import totals

PAGE = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0
vllm:num_requests_waiting{engine="1",model_name="b"} 3.0
vllm:num_requests_waiting{model_name="a model } with spaces"} 1.5 1700000000000
up 1
"""


def test_named_totals_read_label_values_with_spaces_and_lines_with_timestamps():
    got = named_totals(PAGE, ["vllm:num_requests_waiting", "up", "absent"])
    assert got == {"vllm:num_requests_waiting": 6.5, "up": 1.0, "absent": 0.0}


@pytest.mark.engine
def test_named_totals_agree_with_the_parser_on_every_sample_of_a_real_engines_page(tiny_engine):
    requests.post(
        tiny_engine.url + "/v1/chat/completions",
        json={"model": tiny_engine.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    ).raise_for_status()  # counters and histograms with something in them
    text = fetch(tiny_engine.url + "/metrics", timeout=10)
    parsed = totals(text)
    assert parsed["vllm:request_success_total"] >= 1
    assert named_totals(text, parsed) == pytest.approx(parsed)
    reading = engine_stats.read(tiny_engine.url)  # the benchmarks' sampler reads through it
    assert reading.finished >= 1 and reading.prompt_tokens > 0


def test_a_sampler_skips_a_failed_request_and_reads_the_engine_alone_once_more_on_leaving(monkeypatch):
    """The periodic reads take the second source on the same clock; the closing one reads the engine only."""
    calls = itertools.count()

    def read(url: str) -> engine_stats.Reading:
        n = next(calls)
        if n == 0:
            raise requests.ConnectionError("busy")
        return engine_stats.Reading(float(n), *[0.0] * 10)

    monkeypatch.setattr(engine_stats, "read", read)
    with engine_stats.Sampler("http://engine", period=0.01, also=lambda: {"gate": 1.0}) as sampler:
        wait_for(lambda: len(sampler.also_readings) >= 2, 10, "two readings")
    assert [r.at for r in sampler.readings] == [float(n) for n in range(1, len(sampler.readings) + 1)]
    assert len(sampler.also_readings) == len(sampler.readings) - 1
    assert sampler.also_readings[:2] == [(0.0, {"gate": 1.0}), (1.0, {"gate": 1.0})]
