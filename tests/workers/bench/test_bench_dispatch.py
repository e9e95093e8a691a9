"""The dispatch benchmark's pure parts: a vLLM engine's occupancy from its /metrics samples (the twin arm), the
worker's histograms read from its /metrics page, and the figures made of a scenario's runs."""

from __future__ import annotations

import dataclasses

import prometheus_client
import pytest

from tidal_workers.bench import dispatch
from tidal_workers.bench.dispatch import Scenario
from tidal_workers.bench.dispatch import held_area
from tidal_workers.bench.dispatch import summarize
from tidal_workers.bench.engine_stats import Reading
from tidal_workers.bench.histograms import HISTOGRAMS
from tidal_workers.bench.histograms import POST
from tidal_workers.bench.histograms import buckets
from tidal_workers.bench.histograms import sums
from tidal_workers.bench.stats import NO_CHANGE

pytestmark = pytest.mark.no_sql

ZERO = Reading(0.0, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0)


def test_requests_held_are_running_plus_waiting_each_held_until_the_next_reading():
    readings = [
        dataclasses.replace(ZERO, at=0.0, running=8, waiting=0),
        dataclasses.replace(ZERO, at=0.5, running=6, waiting=2),  # the same 8 at the engine, 2 not yet scheduled
        dataclasses.replace(ZERO, at=1.0, running=4, waiting=0),
        dataclasses.replace(ZERO, at=2.0, running=0, waiting=0),
    ]
    assert held_area(readings) == pytest.approx(8 * 0.5 + 8 * 0.5 + 4 * 1.0)
    assert held_area(readings[:1]) == 0.0


def test_both_arms_send_one_body_that_generates_exactly_max_tokens():
    body = Scenario(200, 8).body("qwen")
    assert body["model"] == "qwen" and body["max_tokens"] == 8 and body["ignore_eos"] is True


def test_the_post_histograms_sum_is_read_from_a_real_workers_metrics_page():
    registry = prometheus_client.CollectorRegistry()
    post = prometheus_client.Histogram(POST, "POSTs", registry=registry, buckets=(0.1, 1.0))
    for seconds in (0.25, 0.5, 2.0):
        post.observe(seconds)
    page = prometheus_client.generate_latest(registry).decode()
    assert sums(page)[POST] == pytest.approx(2.75)
    assert sums(page)["tidal_dispatch_release_seconds"] == 0.0  # absent from the page: nothing observed
    assert buckets(page)[POST] == [(0.1, 0.0), (1.0, 2.0), (float("inf"), 3.0)]


def _run(held: float, sent: float, loop_held: float, answers: float = 10.0) -> dict:
    histograms = {name: [(0.005, 1.0), (float("inf"), 2.0)] for name in HISTOGRAMS}
    return {
        "tidal": {
            "window": {"held_mean": held, "answers_per_s": answers},
            "sent_mean": sent,
            "gate_target": 8.0,
            "histograms": histograms,
        },
        "closed_loop": {"held_mean": loop_held, "answers_per_s": answers},
    }


def test_requests_at_the_engine_are_judged_both_as_the_worker_sent_them_and_as_the_engine_held_them():
    """Sent and not answered, from the worker's POST time (the issue's definition), against the target; what the
    engine's /metrics showed, against the target and against the closed loop read by the same instrument."""
    summary = summarize([_run(6.0, 7.6, 6.4), _run(6.2, 7.8, 6.4), _run(5.8, 7.7, 6.0)], Scenario(150, 8))
    assert summary["sent_over_target"]["value"] == pytest.approx(7.7 / 8)
    assert summary["engine_held_over_target"]["value"] == pytest.approx(6.0 / 8)
    assert summary["engine_held_over_closed_loop"]["value"] == pytest.approx((6.0 / 6.4 + 6.2 / 6.4 + 5.8 / 6.0) / 3)
    assert summary["tokens_per_s_ratio"]["value"] == pytest.approx(1.0)
    assert summary["dispatch"][POST]["share_le_5ms"] == 0.5


def _command(release_ms: list[float]) -> dict:
    """One `tidal bench dispatch` document: a scenario whose repetitions' releases all took the given times."""
    runs = []
    for ms in release_ms:
        run = _run(6.0, 7.6, 6.4)
        histograms = dict(run["tidal"]["histograms"])  # every observation in (0, 2·ms]: the median is ms
        histograms["tidal_dispatch_release_seconds"] = [[2 * ms / 1000, 4.0], [float("inf"), 4.0]]
        run["tidal"] = {**run["tidal"], "histograms": histograms}
        runs.append(run)
    return {"scenarios": [{"scenario": {"delay_ms": 150.0, "max_tokens": 8}, "runs": runs}]}


def test_two_code_versions_compare_by_their_repetitions_medians_new_over_old():
    """Whole commands per arm, repetitions pooled per arm: new ÷ old of the mean per-repetition median, with an
    interval; equal arms are "no measurable change", a twice-as-slow one is not."""
    old = [_command([4.0, 4.0, 4.0]), _command([4.0, 4.0, 4.0])]
    same = dispatch.compare(old, [_command([4.0, 4.0, 4.0]), _command([4.0, 4.0, 4.0])])["150ms-max8"]
    release = same["release_p50_ms"]
    assert release["samples"]["old"] == pytest.approx([4.0] * 6) and release["new"]["reps"] == 6
    assert release["new_over_old"]["value"] == pytest.approx(1.0) and release["verdict"].startswith(NO_CHANGE)
    slower = dispatch.compare(old, [_command([8.0, 8.0, 8.0])])["150ms-max8"]["release_p50_ms"]
    assert slower["new_over_old"]["value"] == pytest.approx(2.0) and not slower["verdict"].startswith(NO_CHANGE)
    assert same["token_to_post_p50_ms"]["samples"]["new"] == pytest.approx([5.0] * 6)  # _run's (0.005: 1 of 2)
