"""The KV guardband (pure)."""

from __future__ import annotations

import pytest

from tidal_engine.guardband import Guardband
from tidal_engine.guardband import Resident
from tidal_engine.guardband import cheapest


def test_guardband_h_is_an_ewma_clamped():
    g = Guardband(h_min=0.05, h_max=0.30, alpha=0.5)
    assert g.h == 0.05
    assert g.observe(0.2) == pytest.approx(0.125)
    for _ in range(20):
        g.observe(0.9)
    assert g.h == 0.30
    for _ in range(40):
        g.observe(0.0)
    assert g.h == 0.05


def test_guardband_thresholds():
    g = Guardband(h_min=0.2, h_max=0.2)
    assert g.admits(0.80) and not g.admits(0.81)
    assert not g.must_evict(0.90) and g.must_evict(0.91)


def test_cheapest_eviction_counts_only_unrecoverable_work():
    residents = [Resident("long-but-cached", 900, 850), Resident("short", 100, 0), Resident("mid", 400, 0)]
    assert cheapest(residents).request_id == "long-but-cached"
    assert cheapest([Resident("a", 64, 64), Resident("b", 32, 32)]).request_id == "b"  # tie: fewer tokens
    assert cheapest([]) is None
