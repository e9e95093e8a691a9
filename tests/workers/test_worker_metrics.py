"""A running `tidal worker` serves the gate's gauges and the queue's depth on TIDAL_WORKER_METRICS_PORT."""

from __future__ import annotations

import re

import pytest
import requests

from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import spawn
from tidal_engine.serve import free_port


@pytest.fixture
def settings(settings):
    # The AIMD gate on the stub's idle /metrics, held at one item in flight so the rest stay queued.
    return settings.replace(
        worker_metrics_port=free_port(), gate_mode="aimd", scrape_seconds=0.2, initial_inflight=1, max_inflight=1
    )


def _sample(text: str, series: str) -> float | None:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_worker_exports_gate_and_queue_metrics(rt, make_batch, stub, settings, children, tmp_path):
    stub.delay = 0.3
    batch = make_batch(8)
    url = f"http://127.0.0.1:{settings.worker_metrics_port}/metrics"
    proc = spawn(settings, "worker", "--loglevel=info", log=tmp_path / "worker.log")
    children.append(proc)
    children.append(spawn(settings, "worker", "--ops", log=tmp_path / "ops.log"))  # it finalizes, as deployed

    def scrape() -> str | None:
        try:
            return requests.get(url, timeout=2).text
        except requests.ConnectionError:
            return None

    # Mid-batch: one item leased by this node, the rest queued in the least urgent band, and the gate has
    # scraped the stub (its KV gauge reads 0 until then; one PostgreSQL CI run read the page in between).
    text = wait_for(
        lambda: (
            (t := scrape())
            and (_sample(t, 'tidal_inflight_items{node="test-node"}') or 0) >= 1
            and _sample(t, "tidal_gate_kv_ewma")
            and t
        ),
        timeout=30,
        what="the worker's /metrics mid-batch",
    )
    assert _sample(text, "tidal_gate_target") == 1.0
    assert _sample(text, 'tidal_queue_depth{band="100"}') >= 1
    assert _sample(text, "tidal_gate_kv_ewma") == pytest.approx(0.1)  # the stub's KV usage
    # Every decision series exists from import, so a count is what shows the gate stepped. A good scrape decides
    # hold, grow or halve (halve when the stub's queue reads as online waiting, as it can on a loaded machine); the
    # counter is incremented before the KV gauge is set, so the page that shows the gauge shows the step.
    stepped = [_sample(text, f'tidal_gate_decisions_total{{decision="{d}"}}') for d in ("hold", "grow", "halve")]
    assert None not in stepped and sum(stepped) >= 1, f"the gate's decision counts read {stepped} after it scraped"

    wait_for(lambda: batch_row(rt, batch).status == "completed", timeout=30, what="the batch to complete")
    text = scrape()
    assert _sample(text, 'tidal_queue_depth{band="100"}') == 0.0
    proc.terminate()
    assert proc.wait(20) == 0
    assert scrape() is None  # the endpoint goes with the worker
