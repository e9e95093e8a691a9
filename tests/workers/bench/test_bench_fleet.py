"""The fleet benchmark's pure parts: arm order, the static split, batch fill per bin, r, inflation, the refusal."""

from __future__ import annotations

import pytest

from tidal_workers.bench import fleet_report as fr
from tidal_workers.bench import stats

pytestmark = pytest.mark.no_sql


def test_arms_run_forwards_then_backwards_so_drift_falls_on_every_arm_alike():
    order = fr.arm_order(2)
    assert [arm for rep, arm in order if rep == 0] == list(fr.ARMS)
    assert [arm for rep, arm in order if rep == 1] == list(reversed(fr.ARMS))
    assert fr.ARMS[0] == fr.BASELINE and set(fr.BATCH_ARMS) == {fr.PLACEMENT, fr.SPLIT, fr.PINNING}


def test_static_split_gives_each_replica_half_the_same_items_in_order():
    items = list(range(7))
    halves = fr.split_evenly(items, 2)
    assert halves == [[0, 1, 2, 3], [4, 5, 6]]
    assert fr.split_evenly(items, 1) == [items]
    assert [len(p) for p in fr.split_evenly(list(range(300)), 2)] == [150, 150]


def _record(at: float, chunks: list[tuple[float, int]], error: str | None = None) -> dict:
    return {"at": at, "late": 0.0, "chunks": [list(c) for c in chunks], "prompt_tokens": 10, "error": error}


def test_online_tokens_in_a_bin_come_from_the_clients_chunk_counts():
    records = [_record(1.0, [(0.5, 1), (2.0, 4), (3.5, 10)]), _record(0.0, [], error="http 500")]
    # chunks at absolute 1.5 (1 token), 3.0 (4), 4.5 (10)
    assert fr.online_tokens_between(records, 0.0, 2.0) == 1
    assert fr.online_tokens_between(records, 2.0, 4.0) == 3
    assert fr.online_tokens_between(records, 4.0, 10.0) == 6


def test_batch_fill_is_engine_tokens_minus_online_tokens_per_bin():
    at = [0.0, 10.0, 20.0]
    generated = [100.0, 200.0, 500.0]  # 10 tokens/s, then 30 tokens/s
    records = [_record(12.0, [(1.0, 50)])]  # 50 online tokens in the second bin
    series = fr.batch_series(at, generated, records, span=20.0, interval=10.0)
    assert series == [(5.0, 10.0), (15.0, (300.0 - 50.0) / 10.0)]


def test_interp_holds_the_counter_flat_beyond_its_readings():
    assert fr.interp([1.0, 3.0], [10.0, 30.0], 0.0) == 10.0
    assert fr.interp([1.0, 3.0], [10.0, 30.0], 2.0) == 20.0
    assert fr.interp([1.0, 3.0], [10.0, 30.0], 9.0) == 30.0


def test_fill_against_online_rate_is_negative_when_batch_fills_the_troughs():
    rate = [1.0, 3.0, 5.0, 3.0, 1.0]
    assert fr.pearson([50.0, 30.0, 10.0, 30.0, 50.0], rate) == pytest.approx(-1.0)
    assert fr.pearson([0.0, 0.0, 0.0, 0.0, 0.0], rate) is None  # no batch work: no correlation to speak of
    assert fr.pearson([1.0, 2.0], [1.0, 2.0]) is None


def test_inflation_compares_the_same_scheduled_requests_that_met_the_batch():
    base = [_record(float(k), [(0.1, 1), (0.2, 2)]) for k in range(10)]
    arm = [_record(float(k), [(0.3 if k < 5 else 0.1, 1), (0.4 if k < 5 else 0.2, 2)]) for k in range(10)]
    early = fr.inflation(arm, base, until=5.0)  # only requests 0-4, which met the batch
    assert early["ttft_p50"] == pytest.approx(3.0)
    assert early["tbt_p50"] == pytest.approx(1.0)
    whole = fr.inflation(arm, base, until=10.0)
    assert whole["ttft_p50"] == pytest.approx(0.2 / 0.1)


def _arm(rep: int, arm: str, harvest: float, inflation: float = 1.0) -> dict:
    replica = {
        "batch_tokens": harvest / 2,
        "r": -0.5,
        "answered_per_s": 2.0,
        "offered_per_s": 2.1,
        "cpu_cores": 0.9,
        "inflation": dict.fromkeys(fr.LATENCY_KEYS, inflation),
    }
    return {
        "rep": rep,
        "arm": arm,
        "batch_tokens_per_s": harvest,
        "makespan_s": 100.0,
        "replicas": [dict(replica), dict(replica)],
    }


def _run(reps: int) -> list[dict]:
    harvest = {fr.BASELINE: 0.0, fr.PLACEMENT: 120.0, fr.SPLIT: 100.0, fr.PINNING: 60.0}
    return [_arm(rep, arm, harvest[arm] + rep) for rep, arm in fr.arm_order(reps)]


def test_ratios_are_per_repetition_and_refused_under_three():
    figures = fr.per_rep(_run(3))
    assert figures["placement_vs_split"] == pytest.approx([120 / 100, 121 / 101, 122 / 102])
    assert figures["placement_vs_pinning"] == pytest.approx([2.0, 121 / 61, 122 / 62])
    assert figures["online_answered_per_s_0"] == [2.0, 2.0, 2.0]
    summary = fr.intervals(_run(2))
    assert "refused" in summary["placement_vs_split"] and "interval" not in summary["placement_vs_split"]
    assert "refused: " in fr.table(_run(2))


def test_a_repetition_missing_an_arm_counts_for_nothing():
    arms = [a for a in _run(3) if not (a["rep"] == 2 and a["arm"] == fr.SPLIT)]
    assert len(fr.per_rep(arms)["placement_vs_split"]) == 2


def test_unchanged_latency_reads_no_measurable_change():
    text = fr.table(_run(3))
    assert stats.NO_CHANGE in text  # inflation exactly 1.0 in every repetition
    assert "1.20×" in text  # placement over split, 3 repetitions: 1.19 mean, interval away from 1.0


def test_the_split_arms_second_redis_db_is_one_no_test_session_holds_and_is_given_back(settings):
    import redis

    from tests.conftest import LOCK_DB
    from tests.conftest import TEST_REDIS_DB
    from tests.conftest import _redis_url
    from tidal_workers.bench.stack import reserved_redis_db

    locks = redis.Redis.from_url(_redis_url(LOCK_DB))
    with reserved_redis_db(settings) as db:
        assert 1 <= db <= 13 and db != TEST_REDIS_DB
        assert locks.get(f"tidal:test-db:{db}") == b"bench"  # test sessions now skip it
    assert locks.get(f"tidal:test-db:{db}") is None


def test_a_run_without_pinning_compares_the_arms_it_ran_and_says_which_it_did_not():
    order = fr.arm_order(2, (fr.PLACEMENT, fr.SPLIT))
    assert order == [
        (0, fr.BASELINE),
        (0, fr.PLACEMENT),
        (0, fr.SPLIT),
        (1, fr.SPLIT),
        (1, fr.PLACEMENT),
        (1, fr.BASELINE),
    ]
    harvest = {fr.BASELINE: 0.0, fr.PLACEMENT: 120.0, fr.SPLIT: 100.0}
    arms = [_arm(rep, arm, harvest[arm] + rep) for rep, arm in fr.arm_order(3, (fr.PLACEMENT, fr.SPLIT))]
    figures = fr.per_rep(arms)
    assert figures["placement_vs_split"] == pytest.approx([120 / 100, 121 / 101, 122 / 102])  # every repetition
    assert "placement_vs_pinning" not in figures and "harvest_pinning" not in figures
    rows = [line for line in fr.table(arms).splitlines()[2:] if "online only" not in line]
    assert {row.split(" | ")[3] for row in rows} == {"not run"}  # the pinning column
    assert "refused" not in fr.table(arms)
