"""The benchmarks' reader of vLLM's /metrics: the samples it sums are the Prometheus parser's."""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tidal_workers.bench import engine_stats

pytestmark = pytest.mark.no_sql


def _parsed_sums(text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return sums


@pytest.mark.engine
def test_sample_sums_agree_with_the_parser_on_every_sample_of_a_real_engines_page(tiny_engine):
    requests.post(
        tiny_engine.url + "/v1/chat/completions",
        json={"model": tiny_engine.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    ).raise_for_status()  # counters and histograms with something in them
    text = requests.get(tiny_engine.url + "/metrics", timeout=10).text
    parsed = _parsed_sums(text)
    assert parsed["vllm:request_success_total"] >= 1
    assert engine_stats.sample_sums(text, parsed) == pytest.approx(parsed)
    reading = engine_stats.read(tiny_engine.url)
    assert reading.finished >= 1 and reading.prompt_tokens > 0


def test_sample_sums_read_label_values_with_spaces_and_lines_with_timestamps():
    text = "\n".join(
        [
            "# HELP x_total Things.",
            "# TYPE x_total counter",
            'x_total{model_name="a model } with spaces",engine="0"} 2.0',
            'x_total{model_name="b",engine="1"} 3.5 1700000000000',
            "y 7",
            "x_total_created 1.7e9",
        ]
    )
    assert engine_stats.sample_sums(text, ["x_total", "y", "z"]) == {"x_total": 5.5, "y": 7.0, "z": 0.0}
