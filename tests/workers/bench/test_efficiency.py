"""E = harvest ÷ H*(α_m) (tidal_workers/bench/efficiency.py) and the paired inflation intervals (bench.stats)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tidal_engine.twin import load_profile
from tidal_workers.bench import efficiency
from tidal_workers.bench import online
from tidal_workers.bench import oracle
from tidal_workers.bench import stats
from tidal_workers.bench.workload import GPU_WORKLOAD

pytestmark = pytest.mark.no_sql

ONLINE = oracle.RequestClass.of(GPU_WORKLOAD.online_prompt, GPU_WORKLOAD.online_output)
BATCH = oracle.RequestClass.of(GPU_WORKLOAD.batch_prompt, GPU_WORKLOAD.batch_output)


def test_alpha_m_is_the_largest_inflation_floored_at_1_10():
    assert efficiency.alpha_m([1.02, 1.05, None, 0.98]) == 1.10
    assert efficiency.alpha_m([1.3, 1.05, 2.4, 1.0]) == 2.4
    assert efficiency.alpha_m([None, math.inf, 1.2]) == 1.2  # an inflation with no finite value is no figure
    assert efficiency.alpha_m([]) == 1.10


def test_the_peers_harvest_at_an_alpha_is_its_curve_interpolated_from_online_alone_never_falling():
    curve = [(1.4, 300.0), (1.2, 100.0)]
    assert efficiency.peer_at(1.15, curve) == pytest.approx(50.0)  # between online alone (1.10, 0) and 100 at 1.2
    assert efficiency.peer_at(1.3, curve) == pytest.approx(200.0)
    assert efficiency.peer_at(1.4, curve) == pytest.approx(300.0)
    assert efficiency.peer_at(1.5, curve) is None  # past its highest point: not extrapolated
    assert efficiency.peer_at(1.3, [*curve, (1.3, 80.0)]) == pytest.approx(100.0)  # a dominated setting
    assert efficiency.peer_at(1.10, [(1.10, 30.0), (1.2, 100.0)]) == pytest.approx(30.0)  # at the floor already
    assert efficiency.peer_at(1.10, []) == 0.0


def test_the_ratio_to_the_peer_pairs_the_harvests_interval_with_alpha_ms():
    curve = [(1.2, 100.0), (1.4, 300.0)]
    over = efficiency.over_peer((400.0, 380.0, 420.0), (1.3, 1.25, 1.35), curve)
    assert over["value"] == pytest.approx(400.0 / 200.0)
    assert over["low"] == pytest.approx(380.0 / 250.0)  # the harvest's low over the peer at alpha_m's high
    assert over["high"] == pytest.approx(420.0 / 150.0)  # the harvest's high over the peer at alpha_m's low
    past = efficiency.over_peer((400.0, 380.0, 420.0), (1.35, 1.3, 1.45), curve)
    assert past["low"] is None and past["high"] == pytest.approx(420.0 / 200.0)  # not extrapolated past 1.4
    floor = efficiency.over_peer((400.0, 380.0, 420.0), (1.15, 1.05, 1.25), curve)
    assert floor["value"] == pytest.approx(8.0) and floor["high"] is None  # the peer takes nothing at 1.05
    alone = efficiency.over_peer((400.0, None, None), (1.3, None, None), curve)
    assert alone == {"value": pytest.approx(2.0), "low": None, "high": None}  # under three repetitions: no bounds


def test_e_is_the_harvest_over_the_oracle_at_alpha_m():
    oracles = efficiency.Oracles(load_profile("qwen2.5-7b@a6000"), ONLINE, BATCH)
    h = oracles.h_star(1.5, 8.0)
    assert h == pytest.approx(oracle.harvest_oracle(oracles.profile, 8.0, ONLINE, BATCH, 1.5).batch_tokens_per_s)
    assert efficiency.efficiency(h / 2, h) == pytest.approx(0.5)
    assert efficiency.efficiency(100.0, 0.0) is None
    assert oracles.h_star(1.5004, 8.0) == h  # cached at 3 decimals of α


def test_a_rate_online_alone_cannot_serve_leaves_no_harvest():
    oracles = efficiency.Oracles(load_profile("qwen2.5-7b@a6000"), ONLINE, BATCH)
    assert oracles.h_star(2.0, 40.0) == 0.0


def test_a_diurnal_phase_is_compared_with_the_oracle_averaged_over_its_rate():
    oracles = efficiency.Oracles(load_profile("qwen2.5-7b@a6000"), ONLINE, BATCH)
    rates = efficiency.phase_rates(online.diurnal(5.0, 0.8, 600.0), 600.0, samples=4)
    assert rates == pytest.approx([5 * (1 - 0.8 * math.cos(2 * math.pi * (i + 0.5) / 4)) for i in range(4)])
    mean = oracles.h_star_over(1.5, rates)
    assert mean == pytest.approx(sum(oracles.h_star(1.5, r) for r in rates) / 4)
    assert oracles.h_star(1.5, 9.0) < mean < oracles.h_star(1.5, 1.0)


def test_paired_inflation_intervals_resample_whole_requests():
    base = [[0.10 + 0.001 * i] for i in range(200)]
    slower = [[1.5 * x for x in r] for r in base]
    p50, p99 = stats.paired_quantile_ratios(base, slower, [0.5, 0.99], resamples=200)
    assert p50 is not None and p99 is not None
    assert p50.value == pytest.approx(1.5) and p50.low == pytest.approx(1.5) and p50.high == pytest.approx(1.5)
    assert p50.reps == 200
    noisy = [[x * (1.2 if i % 2 else 1.8) for x in r] for i, r in enumerate(base)]
    (ratio,) = stats.paired_quantile_ratios(base, noisy, [0.5], resamples=300)
    assert ratio is not None and ratio.low < ratio.value < ratio.high


def test_paired_ratios_need_samples_in_both_arms_and_the_same_requests():
    assert stats.paired_quantile_ratios([[], []], [[0.1], [0.2]], [0.5]) == [None]
    with pytest.raises(ValueError, match="same requests"):
        stats.paired_quantile_ratios([[0.1]], [[0.1], [0.2]], [0.5])


def test_paired_quantiles_interpolate_as_percentile_does():
    rng = random.Random(5)
    per_request = [[rng.random() for _ in range(rng.randint(0, 5))] for _ in range(50)]
    flat = [x for r in per_request for x in r]
    ratio = stats.paired_quantile_ratios(per_request, [[2 * x for x in r] for r in per_request], [0.5, 0.9, 0.99])
    assert [r.value for r in ratio if r] == pytest.approx([2.0, 2.0, 2.0])
    arm = stats._Arm.of(per_request)
    ones = np.ones(50, int)
    expected = [stats.percentile(flat, q) for q in (0.1, 0.5, 0.99)]
    assert list(arm.quantiles(ones, np.array([0.1, 0.5, 0.99]))) == pytest.approx(expected)
