"""tidal_workers.scrape: fetching a /metrics page and summing its series, as the gate and the benchmarks do."""

from __future__ import annotations

import pytest
import requests
from workers.stub_engine import metrics_text

from tidal_workers.bench import engine_stats
from tidal_workers.scrape import fetch
from tidal_workers.scrape import named_totals
from tidal_workers.scrape import read_totals
from tidal_workers.scrape import totals

PAGE = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0
vllm:num_requests_waiting{engine="1",model_name="b"} 3.0
# HELP vllm:num_preemptions Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="a"} 4.0
"""


def test_totals_sum_each_series_over_its_label_sets():
    assert totals(PAGE) == {"vllm:num_requests_waiting": 5.0, "vllm:num_preemptions_total": 4.0}


def test_totals_keep_only_the_names_asked_for():
    assert totals(PAGE, {"vllm:num_preemptions_total", "absent"}) == {"vllm:num_preemptions_total": 4.0}


def test_read_totals_reads_a_live_page(stub):
    stub.metrics = metrics_text(kv_usage=0.25, waiting=3, running=2, preemptions=1)
    got = read_totals(stub.url + "/metrics", {"vllm:num_requests_waiting", "vllm:num_requests_running"})
    assert got == {"vllm:num_requests_waiting": 3.0, "vllm:num_requests_running": 2.0}
    assert stub.scrapes == 1


def test_fetch_refuses_a_page_answered_with_another_status(stub):
    with pytest.raises(requests.HTTPError, match=r"/nothing-here answered HTTP 404"):
        fetch(stub.url + "/nothing-here", timeout=5)


def test_named_totals_read_label_values_with_spaces_and_lines_with_timestamps():
    page = PAGE + 'vllm:num_requests_waiting{model_name="a model } with spaces"} 1.5 1700000000000\nup 1\n'
    got = named_totals(page, ["vllm:num_requests_waiting", "up", "absent"])
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
