"""The online client's lead-in (its process, against the fixed-time engine) and the vLLM-alone peer's lanes."""

from __future__ import annotations

import itertools
import time

import pytest

from tidal_workers.bench.backlog import Lanes
from tidal_workers.bench.client import OnlineClient
from tidal_workers.bench.fixed_engine import MODEL
from tidal_workers.bench.fixed_engine import FixedEngine
from tidal_workers.bench.workload import Request
from tidal_workers.bench.workload import chat_body

pytestmark = pytest.mark.no_sql


@pytest.fixture
def engine():
    fixed = FixedEngine(delay=0.02)
    yield fixed
    fixed.close()


def test_the_lead_in_stops_where_the_measured_requests_open(engine, tmp_path):
    lead_in = [Request(round(0.1 * i, 1), f"lead {i}", 4) for i in range(40)]  # 4 s of lead-in, one every 0.1 s
    measured = [Request(0.05 * i, f"measured {i}", 4) for i in range(5)]
    client = OnlineClient(tmp_path, engine.url, MODEL, measured, lead_in=lead_in)
    client.ready()
    lead_opens = time.monotonic() + 0.3
    client.start(lead_opens)
    client.start(lead_opens + 0.65)  # told at once: the lead-in learns its end before it gets there
    records = client.wait(timeout=60)
    lead = client.lead_in_records()
    assert [r["at"] for r in lead] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]  # due before 0.65; none after
    assert [r["at"] for r in records] == [r.at for r in measured]
    assert all(r["error"] is None for r in lead + records)


def test_a_third_instant_closes_the_measured_requests(engine, tmp_path):
    measured = [Request(round(0.1 * i, 1), f"measured {i}", 4) for i in range(40)]  # 4 s, one every 0.1 s
    client = OnlineClient(tmp_path, engine.url, MODEL, measured, lead_in=[Request(0.0, "lead", 4)])
    client.ready()
    lead_opens = time.monotonic() + 0.3
    client.start(lead_opens)
    client.start(lead_opens + 0.2)
    client.start(lead_opens + 0.2 + 0.65)  # the window closes 0.65 s after it opened
    records = client.wait(timeout=60)
    assert [r["at"] for r in records] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert all(r["error"] is None for r in records)


def test_lanes_keep_their_requests_at_the_engine_and_count_completions(engine):
    bodies = (chat_body(MODEL, Request(0.0, "x", 4), priority=100) for _ in itertools.count())
    seen = set()
    with Lanes(engine.url, bodies, 4) as lanes:
        deadline = time.monotonic() + 30
        while lanes.counts.done < 40 and time.monotonic() < deadline:
            seen |= {lanes.counts.inflight, engine.occupancy.held}
            time.sleep(0.01)
    assert lanes.counts.done >= 40
    assert max(seen) == 4  # each lane waits 20 ms on its answer: mostly all four are at the engine, never more
    assert lanes.failed is None
