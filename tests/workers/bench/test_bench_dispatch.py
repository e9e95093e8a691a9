"""The dispatch benchmark's reading of a vLLM engine's occupancy from its /metrics samples (the twin arm)."""

from __future__ import annotations

import dataclasses

import pytest

from tidal_workers.bench.dispatch import Scenario
from tidal_workers.bench.dispatch import held_area
from tidal_workers.bench.engine_stats import Reading

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
