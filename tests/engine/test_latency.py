"""The step-latency model and the batch cap (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from tidal_engine.latency import Fit
from tidal_engine.latency import LatencyModel
from tidal_engine.latency import batch_cap

K = (2e-4, 3e-5, 1e-5, 0.012)  # k1, k2, k4, k5 in seconds per token (per token², ...)


def true_time(p, c):
    p, c = np.asarray(p, float), np.asarray(c, float)
    return K[0] * p + K[1] * p * (p + c) / 1000 + K[2] * (p + c) + K[3]


def test_fit_recovers_the_coefficients():
    rng = np.random.default_rng(0)
    model = LatencyModel(window=4000, refit_every=100)
    p, c = rng.integers(1, 2048, 1000), rng.integers(0, 20000, 1000)
    for pi, ci, ti in zip(p, c, true_time(p, c)):
        model.observe(int(pi), int(ci), float(ti))
    assert model.fit.num_samples == 1000 and model.fit.r2 > 0.9999
    assert np.allclose(model.fit.predict([512, 100], [4000, 0]), true_time([512, 100], [4000, 0]), rtol=1e-6)


def test_window_forgets_old_steps():
    model = LatencyModel(window=50, refit_every=50, min_samples=10)
    for i in range(50):
        model.observe(100 + i, 0, 1.0)  # a regime that no longer holds
    for i in range(50):
        model.observe(100 + 20 * i, 0, 0.01 + 1e-4 * (100 + 20 * i))
    assert model.num_samples == 50
    assert model.fit.r2 > 0.999 and model.fit.predict([1000], [0])[0] == pytest.approx(0.11)


def test_not_trusted_before_enough_samples_or_with_flat_data():
    model = LatencyModel(refit_every=1, min_samples=32)
    for _ in range(31):
        model.observe(100, 0, 0.05)
    assert model.fit is None and not model.trusted(0.85)
    model.observe(100, 0, 0.05)
    assert model.fit.r2 == 0.0 and not model.trusted(0.85)  # identical steps carry no slope


def linear_fit(per_token: float, fixed: float) -> Fit:
    return Fit((per_token * 1000, 0.0, 0.0, fixed), 1.0, 100)


def test_batch_cap_is_the_largest_fitting_count():
    fit = linear_fit(1e-4, 0.01)  # 160 ms (and half a token's time) fits 1500 tokens
    assert batch_cap(fit, online_tokens=200, context=0, budget_s=0.16005, max_tokens=2048) == 1300
    assert batch_cap(fit, online_tokens=0, context=0, budget_s=10.0, max_tokens=2048) == 2048
    assert batch_cap(fit, online_tokens=1600, context=0, budget_s=0.16, max_tokens=2048) == 0
    # More resident context leaves less room.
    fit_c = Fit((0.1, 0.0, 0.02, 0.01), 1.0, 100)
    assert batch_cap(fit_c, 0, 5000, 0.16, 2048) < batch_cap(fit_c, 0, 0, 0.16, 2048)


def test_batch_cap_stops_at_the_first_point_over_budget():
    # A noisy fit that bends down at large P must not grant a cap past the hump.
    fit = Fit((0.3, -0.1, 0.0, 0.0), 1.0, 100)  # peaks near P = 1500
    cap = batch_cap(fit, 0, 0, 0.2, 4000)
    assert cap < 1500 and fit.predict([cap], [0])[0] <= 0.2 < fit.predict([cap + 1], [0])[0]
