"""The gate's signal maps: the same Observation from vLLM's names, a prefill + decode pool, or Dynamo's names.

Dynamo's pages below follow its published metrics reference (docs.nvidia.com/dynamo, "Dynamo Metrics"):
workers expose ``dynamo_component_kvstats_*`` gauges (label ``dp_rank`` and the hierarchy labels) next to
vLLM's own series, the frontend ``dynamo_frontend_queued_requests`` / ``dynamo_frontend_inflight_requests``
per ``model`` (the docs' example: 7 queued, 10 in flight).
"""

from __future__ import annotations

import pytest

from config.settings import GATE_SIGNAL_SOURCES
from config.settings import SettingsError
from tests.support.vllm_metrics import MetricsServer
from tests.support.vllm_metrics import vllm_metrics
from tidal_workers.gate import AimdGate
from tidal_workers.gate import MetricsError
from tidal_workers.gate import parse_pages
from tidal_workers.policy.aimd import FAILSAFE
from tidal_workers.policy.aimd import HALVE
from tidal_workers.signals import DECODE
from tidal_workers.signals import DISAGG
from tidal_workers.signals import DYNAMO
from tidal_workers.signals import MAPS
from tidal_workers.signals import PREFILL
from tidal_workers.signals import ROUTER
from tidal_workers.signals import VLLM


def dynamo_worker(kv: float, preemptions: float) -> str:
    hierarchy = 'dp_rank="0",dynamo_component="backend",dynamo_endpoint="generate",dynamo_namespace="dynamo"'
    return (
        "# HELP dynamo_component_kvstats_gpu_cache_usage_percent GPU cache usage as a percentage (0.0-1.0)\n"
        "# TYPE dynamo_component_kvstats_gpu_cache_usage_percent gauge\n"
        f"dynamo_component_kvstats_gpu_cache_usage_percent{{{hierarchy}}} {kv}\n"
        "# HELP dynamo_component_kvstats_active_blocks Number of active KV cache blocks currently in use\n"
        "# TYPE dynamo_component_kvstats_active_blocks gauge\n"
        f"dynamo_component_kvstats_active_blocks{{{hierarchy}}} 96\n"
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        f'vllm:num_preemptions_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {preemptions}\n'
    )


FRONTEND = (
    "# HELP dynamo_frontend_queued_requests Number of requests in HTTP processing queue\n"
    "# TYPE dynamo_frontend_queued_requests gauge\n"
    'dynamo_frontend_queued_requests{model="qwen/qwen3-0.6b"} 7\n'
    "# HELP dynamo_frontend_inflight_requests Inflight requests\n"
    "# TYPE dynamo_frontend_inflight_requests gauge\n"
    'dynamo_frontend_inflight_requests{model="qwen/qwen3-0.6b"} 10\n'
)


def test_settings_and_maps_name_the_same_pages():
    assert set(GATE_SIGNAL_SOURCES) == set(MAPS)
    for name, m in MAPS.items():
        assert tuple(s for s in m.sources() if s != "engine") == GATE_SIGNAL_SOURCES[name]


def test_disaggregated_pools_take_the_fuller_kv_and_sum_the_counts():
    pages = {
        PREFILL: vllm_metrics(kv=0.2, waiting=3, running=5, preemptions=1),
        DECODE: vllm_metrics(kv=0.7, waiting=0, running=40, preemptions=2),
    }
    obs = parse_pages(pages, 0.0, 5.0, 4, DISAGG)
    assert (obs.kv_usage, obs.waiting, obs.running, obs.preemptions_total, obs.batch_inflight) == (0.7, 3, 45, 3, 4)


def test_dynamo_names_map_to_the_same_observation():
    pages = {PREFILL: dynamo_worker(0.31, 0), DECODE: dynamo_worker(0.58, 2), ROUTER: FRONTEND}
    obs = parse_pages(pages, 0.0, 5.0, 1, DYNAMO)
    assert (obs.kv_usage, obs.waiting, obs.running, obs.preemptions_total) == (0.58, 7, 10, 2)


def test_a_pool_page_that_lacks_a_signal_fails_the_reading_and_says_which():
    pages = {PREFILL: vllm_metrics(), DECODE: vllm_metrics(drop=("vllm:num_preemptions_total",))}
    with pytest.raises(MetricsError, match="vllm:num_preemptions_total on decode"):
        parse_pages(pages, 0.0, 5.0, 0, DISAGG)
    with pytest.raises(MetricsError, match="dynamo_frontend_queued_requests on router"):
        parse_pages({PREFILL: dynamo_worker(0.1, 0), DECODE: dynamo_worker(0.1, 0)}, 0.0, 5.0, 0, DYNAMO)


def test_the_default_map_reads_only_the_engine_page():
    assert VLLM.sources() == ("engine",)
    assert parse_pages({"engine": vllm_metrics(kv=0.5, waiting=1)}, 0.0, 5.0, 0).kv_usage == 0.5


@pytest.mark.parametrize(
    "urls, why",
    [
        ("", "names no page for prefill, decode"),
        ("prefill=http://127.0.0.1:1/metrics", "names no page for decode"),
        ("prefill=127.0.0.1:1,decode=http://127.0.0.1:2/metrics", "is not SOURCE=http"),
        ("pool=http://127.0.0.1:1/metrics", "is not SOURCE=http"),
    ],
)
def test_settings_refuse_a_map_without_its_pages(settings, urls, why):
    with pytest.raises(SettingsError, match=why):
        settings.replace(gate_signals="disagg", gate_metrics_urls=urls)


def test_the_gate_steps_the_same_rule_on_two_pools(settings):
    prefill, decode = MetricsServer(), MetricsServer()
    try:
        gate_settings = settings.replace(
            gate_mode="aimd",
            gate_signals="disagg",
            gate_metrics_urls=f"prefill={prefill.url}/metrics,decode={decode.url}/metrics",
            scrape_seconds=1.0,
            min_inflight=0,
            max_inflight=4,
            initial_inflight=4,
        )
        gate = AimdGate(gate_settings)
        prefill.body = vllm_metrics(kv=0.1, waiting=6)  # online requests queue on the prefill pool
        decode.body = vllm_metrics(kv=0.1)
        decisions = []
        for second in range(10, 13):
            gate.poll(float(second), gate.state.target)
            decisions.append(gate.state.decision)
        assert HALVE in decisions and gate.state.target < 4
        assert prefill.hits == decode.hits == 3  # one scrape of each page per period
        decode.status = 503  # one pool unreadable: the whole reading fails safe
        assert gate.poll(13.0, gate.state.target) == 0 and gate.state.decision == FAILSAFE
    finally:
        prefill.stop()
        decode.stop()
