"""The host's time a cycle takes beyond T̂ (tidal_engine/host_time.py; pure)."""

from __future__ import annotations

import numpy as np
import pytest

from tidal_engine.host_time import MIN_CYCLES
from tidal_engine.host_time import NONE
from tidal_engine.host_time import HostFit
from tidal_engine.host_time import HostTime

pytestmark = pytest.mark.no_sql


def cycles(fit: HostFit, host: HostTime, count: int, seed: int = 3, noise_s: float = 0.002) -> None:
    """``count`` cycles of 40-120 requests on ``host``, each ±2 ms of noise (a 2-core twin's cycles swing so)."""
    rng = np.random.default_rng(seed)
    for n in rng.integers(40, 121, count):
        fit.observe(int(n), host.seconds(int(n)) + float(rng.normal(0, noise_s)), predicted=0.030)


def test_the_fit_finds_a_hosts_fixed_and_per_request_time_and_follows_it_when_it_changes():
    """The twin's host at 8 online requests/s: ~4 ms a step and ~0.06 ms a request; then a host half as busy."""
    fit = HostFit()
    cycles(fit, HostTime(0.004, 60e-6), 5000)
    assert fit.host.per_step == pytest.approx(0.004, abs=0.001)
    assert fit.host.per_request == pytest.approx(60e-6, rel=0.2)
    cycles(fit, HostTime(0.002, 30e-6), 8000, seed=4)  # ~1,000 cycles' memory: eight of them on
    assert fit.host.per_step == pytest.approx(0.002, abs=0.001)
    assert fit.host.per_request == pytest.approx(30e-6, rel=0.2)


def test_a_cold_fit_charges_nothing_and_a_stall_is_left_out():
    fit = HostFit()
    for _ in range(MIN_CYCLES - 1):
        fit.observe(50, 0.005, predicted=0.030)
    assert fit.host == NONE
    fit.observe(50, 0.005, predicted=0.030)
    assert fit.host.seconds(50) == pytest.approx(0.005)
    cycles = fit.cycles
    fit.observe(50, 0.5, predicted=0.030)  # a pause of half a second: not the host's share of a 30-ms step
    assert fit.cycles == cycles and fit.host.seconds(50) == pytest.approx(0.005)


def test_a_host_faster_than_the_model_is_charged_nothing():
    """Async scheduling overlaps the host with the forward: cycles at or under T̂ charge no time, never a credit."""
    fit = HostFit()
    cycles(fit, HostTime(-0.001, 0.0), 2000)
    assert fit.host == HostTime(0.0, 0.0)
    fit = HostFit()
    cycles(fit, HostTime(-0.002, 40e-6), 3000, noise_s=0.0)  # through the origin where the line's foot is below it
    assert fit.host.per_step == 0.0 and fit.host.per_request >= 0.0
