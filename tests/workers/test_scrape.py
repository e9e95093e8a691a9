"""tidal_workers.scrape: fetching a /metrics page and summing its series, as the gate does."""

from __future__ import annotations

import pytest
import requests

from tests.support.stub_engine import metrics_text
from tidal_workers.scrape import fetch
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


def test_totals_of_a_live_page(stub):
    stub.metrics = metrics_text(kv_usage=0.25, waiting=3, running=2, preemptions=1)
    got = totals(fetch(stub.url + "/metrics", timeout=5), {"vllm:num_requests_waiting", "vllm:num_requests_running"})
    assert got == {"vllm:num_requests_waiting": 3.0, "vllm:num_requests_running": 2.0}
    assert stub.scrapes == 1


def test_fetch_refuses_a_page_answered_with_another_status(stub):
    with pytest.raises(requests.HTTPError, match=r"/nothing-here answered HTTP 404"):
        fetch(stub.url + "/nothing-here", timeout=5)
