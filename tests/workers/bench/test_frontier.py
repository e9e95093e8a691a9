"""The frontier's measurement, its pure parts (tidal_workers/bench/frontier.py): the online trace every arm of a
block sends, a window's length, the batch's samples with the online tokens taken out, and the observer's error
reaching settle()."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import typing as t

import pytest

from config import load_settings
from tests.support.bench_helpers import frontier_plan
from tidal_engine.tiny import build_tiny
from tidal_workers.bench import engine_stats
from tidal_workers.bench import frontier
from tidal_workers.bench import steady
from tidal_workers.bench.frontier_plan import COSERVED
from tidal_workers.bench.frontier_plan import Point
from tidal_workers.bench.frontier_plan import RunDir
from tidal_workers.bench.workload import ONLINE_LOADS
from tidal_workers.bench.workload import Prompts
from tidal_workers.bench.workload import load_tokenizer

pytestmark = pytest.mark.no_sql

PLAN = frontier_plan(
    loads=("flat-8", "diurnal-5"),
    reps=2,
    window_s=30.0,
    diurnal_window_s=60.0,
    settle_max_s=10.0,
    hold_s=5.0,
    baseline_lead_s=5.0,
)


def test_every_arm_of_a_block_gets_the_same_trace_with_words_of_its_own():
    trace = frontier.OnlineTrace.of(PLAN, ONLINE_LOADS["flat-8"], 0)
    assert trace == frontier.OnlineTrace.of(PLAN, ONLINE_LOADS["flat-8"], 0)
    assert trace != frontier.OnlineTrace.of(PLAN, ONLINE_LOADS["flat-8"], 1)  # another repetition, another draw
    assert trace.measured[-1].at < PLAN.window_s <= trace.lead_in[-1].at  # the lead-in outlasts any settling
    assert 150 < len(trace.measured) < 330  # 8/s for 30 s
    tokenizer = load_tokenizer(str(build_tiny(load_settings().home, "twin")))
    _, one = trace.requests(Prompts(tokenizer, 1))
    _, two = trace.requests(Prompts(tokenizer, 2))
    assert [(r.at, r.max_tokens) for r in one] == [(r.at, r.max_tokens) for r in two]
    assert [len(tokenizer.encode(r.prompt, add_special_tokens=False)) for r in one[:20]] == [
        i.prompt_tokens for i in trace.measured[:20]
    ]
    assert all(a.prompt != b.prompt for a, b in zip(one, two))  # no prefix-cache hit between arms


def test_a_diurnal_trace_starts_at_its_trough_and_its_lead_in_at_that_rate():
    trace = frontier.OnlineTrace.of(PLAN, ONLINE_LOADS["diurnal-5"], 0)
    first_half = sum(i.at < 15 for i in trace.measured)  # the trough's quarter of the period ...
    middle = sum(15 <= i.at < 45 for i in trace.measured)  # ... against the peak's half
    assert middle > 3 * first_half
    lead_rate = len(trace.lead_in) / trace.lead_in[-1].at
    assert lead_rate == pytest.approx(1.0, rel=0.5)  # 5/s × (1 − 0.8)


def test_batch_samples_are_the_engine_s_counters_less_the_online_tokens():
    # The batch prefills 1,000 tokens and generates 500 a second; the engine's counters also hold the online ones:
    # the lead-in's request (opened at 99.0: prompt 300 and a token at 99.5, two more at 100.5) and the measured
    # one (opened at 101.0: prompt 200 and its token at 101.5).
    engine = [(300, 1), (1300, 503), (2500, 1004), (3500, 1504)]
    rows = [
        {"at": 100.0 + i, "at_engine": 10.0, "completions": float(i), "prompt_tokens": p, "generation_tokens": g}
        for i, (p, g) in enumerate(engine)
    ]
    lead = [{"at": 0.0, "error": None, "prompt_tokens": 300, "chunks": [[0.5, 1], [1.5, 3]]}]
    measured = [{"at": 0.2, "error": None, "prompt_tokens": 200, "chunks": [[0.3, 1]]}]
    assert frontier.batch_samples(rows, [(lead, 99.0), (measured, 101.0)]) == [
        [0.0, 10.0, 0.0, 0.0, 0.0],
        [1.0, 10.0, 1.0, 1000.0, 500.0],
        [2.0, 10.0, 2.0, 2000.0, 1000.0],
        [3.0, 10.0, 3.0, 3000.0, 1500.0],
    ]
    # Staged prefill: by the third row the worker's warm-ups had sent prompts of 640 tokens and generated 5.
    staged = [{**r, "warmups": 5.0 * (i >= 2), "warmup_tokens": 640.0 * (i >= 2)} for i, r in enumerate(rows)]
    for row in staged:
        row["prompt_tokens"] += row["warmup_tokens"]
        row["generation_tokens"] += row["warmups"]
    assert frontier.batch_samples(staged, [(lead, 99.0), (measured, 101.0)]) == frontier.batch_samples(
        rows, [(lead, 99.0), (measured, 101.0)]
    )


def test_an_observer_keeps_an_error_of_its_own_for_settle_and_stops_sampling(monkeypatch):
    monkeypatch.setattr(engine_stats, "read", lambda url, timeout: engine_stats.Reading(0.0, *[0.0] * 10))
    monkeypatch.setattr(frontier, "PERIOD_S", 0.01)

    def counts(reading: engine_stats.Reading) -> dict[str, float]:
        raise KeyError("at_engine")

    observer = frontier.Observer("http://engine", counts)
    # The closing reading raises the KeyError too, on leaving.
    with pytest.raises(KeyError), observer, pytest.raises(RuntimeError, match="the sampler stopped"):
        observer.settle(hold_s=1.0, settle_max_s=30.0)
    assert isinstance(observer.error, KeyError)
    assert observer.rows == []


def test_a_window_short_of_its_completions_runs_on_to_hold_them_up_to_its_longest():
    need = steady.MIN_COMPLETIONS
    assert frontier.window_length(180, 420, need, 178) == 180  # on pace: the planned window
    assert frontier.window_length(180, 420, need / 2, 178) == pytest.approx(1.1 * need / (need / 2 / 178))
    assert frontier.window_length(180, 420, 20, 178) == 420  # too slow to reach them: the longest
    assert frontier.window_length(180, 420, 0, 178) == 420
    assert frontier.window_length(180, 0, 20, 178) == 180  # no longest set: windows are fixed


def test_the_measured_trace_runs_the_longest_window_and_is_the_same_prefix_whatever_the_plan_s_longest():
    longer = frontier.OnlineTrace.of(frontier_plan(window_s=30.0, window_max_s=60.0), ONLINE_LOADS["flat-8"], 0)
    plain = frontier.OnlineTrace.of(frontier_plan(window_s=30.0), ONLINE_LOADS["flat-8"], 0)
    assert 55 < longer.measured[-1].at < 60 and 25 < plain.measured[-1].at < 30
    assert longer.measured[: len(plain.measured)] == plain.measured


def test_a_time_scaled_plan_stretches_the_trace_and_tidal_s_control_periods_and_runs_the_scaled_twin(tmp_path):
    slow_plan = dataclasses.replace(PLAN, time_scale=2.0)
    assert slow_plan.twin_profile == "qwen2.5-7b@a6000*2" and PLAN.twin_profile == "qwen2.5-7b@a6000"
    plain = frontier.OnlineTrace.of(PLAN, ONLINE_LOADS["flat-8"], 0)
    slow = frontier.OnlineTrace.of(slow_plan, ONLINE_LOADS["flat-8"], 0)
    assert [i.at for i in slow.measured] == pytest.approx([2 * i.at for i in plain.measured])
    assert [i.max_tokens for i in slow.measured] == [i.max_tokens for i in plain.measured]
    settings = load_settings()
    run = frontier.Frontier(slow_plan, None, settings, RunDir(tmp_path), print)  # type: ignore[arg-type]
    assert run.settings.scrape_seconds == 2 * settings.scrape_seconds
    assert run.settings.sched_max_park_seconds == 2 * settings.sched_max_park_seconds
    assert run.settings.sched_tbt_slo_ms == 2 * settings.sched_tbt_slo_ms
    knob: dict[str, t.Any] = {}
    point = Point(COSERVED, "standard", 0, "flat-8", "inside", 1.1)
    run._inside(point, knob)  # makes the engine's context, enters none
    assert knob["sched_profile"] == "qwen2.5-7b@a6000*2"  # the point records the profile its plugin priced with


def test_the_batch_is_entered_only_after_the_online_lead_in_started_and_its_lead_passed():
    """Sent first, the batch met an engine with no online work, where TidalScheduler admits it into every slot."""
    events: list[tuple[str, float]] = []

    class Client:  # the one call _online_then_batch makes of an OnlineClient
        def start(self, at: float) -> None:
            events.append(("online", at))

    @contextlib.contextmanager
    def batch() -> t.Iterator[None]:
        events.append(("batch", time.monotonic()))
        yield

    with contextlib.ExitStack() as flows:
        opens = frontier._online_then_batch(Client(), flows, batch(), 0.3)  # type: ignore[arg-type]
    assert [name for name, _ in events] == ["online", "batch"]
    assert events[0][1] == opens
    assert events[1][1] >= opens + 0.3
