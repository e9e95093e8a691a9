"""`tidal batches watch ID`: progress lines while a real worker runs the batch, then the final status and cost."""

from __future__ import annotations

import re

import pytest
from celery.contrib.testing.worker import start_worker
from click.testing import CliRunner

from tests.support.stub_engine import StubEngine
from tests.support.worker_helpers import on_stub
from tests.support.worker_helpers import upload_batch
from tidal_api.cli import main
from tidal_api.cli.watch import final_summary
from tidal_api.cli.watch import progress_line
from tidal_workers.celery_app import make_celery


def test_progress_line_counts_failed_items_as_done():
    batch = {"status": "in_progress", "request_counts": {"total": 10, "completed": 3, "failed": 2}}
    assert progress_line(batch, 0.5, width=10) == "[#####.....] 5/10 in_progress    0.50/s eta 0:00:10"


def test_progress_line_before_a_rate_and_when_stalled():
    batch = {"status": "validating", "request_counts": {"total": 0, "completed": 0, "failed": 0}}
    assert progress_line(batch, None, width=4) == "[....] 0/0 validating     -- /s eta --:--"
    stalled = {"status": "in_progress", "request_counts": {"total": 4, "completed": 1, "failed": 0}}
    assert progress_line(stalled, 0.0, width=4).endswith("0.00/s eta stalled")
    slow = {"status": "in_progress", "request_counts": {"total": 10_001, "completed": 1, "failed": 0}}
    assert progress_line(slow, 2.0).endswith("eta 1:23:20")


def test_final_summary_with_and_without_cost():
    batch = {
        "id": "batch_1",
        "status": "completed",
        "request_counts": {"total": 3, "completed": 2, "failed": 1},
        "usage": {"total_tokens": 30},
    }
    assert final_summary(batch) == "batch_1 completed: 2 completed, 1 failed; 30 tokens"
    batch["tidal"] = {"cost": {"batch_usd": 0.0000045, "online_usd": 0.000009, "saved_usd": 0.0000045}}
    assert final_summary(batch) == (
        "batch_1 completed: 2 completed, 1 failed; 30 tokens; billed $0.000005 (online $0.000009, saved $0.000005)"
    )


@pytest.fixture
def stub():
    engine = StubEngine(delay=0.2)
    yield engine
    engine.close()


@pytest.fixture
def settings(settings, stub):
    return on_stub(
        settings,
        stub,
        max_inflight=2,
        worker_threads=2,
        claim_idle_seconds=0.02,
        prices='{"*": [0.15, 0.60]}',
        batch_discount=0.5,
    )


@pytest.mark.timeout(60)
def test_watch_follows_a_batch_to_completion(rt, settings, live_api):
    batch_id = upload_batch(live_api.url, 8, tag="w")

    with start_worker(
        make_celery(settings),
        pool="threads",
        concurrency=2,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=20,
        hostname="tidal@test-node",
    ):
        result = CliRunner().invoke(
            main, ["batches", "watch", batch_id, "--url", live_api.url, "--key", "acme-key", "--interval", "0.1"]
        )
    assert result.exit_code == 0, result.output
    *progress, summary = [x for x in re.split(r"[\r\n]", result.output) if x]
    done = [int(m.group(1)) for m in (re.search(r"\] (\d+)/8 ", p) for p in progress)]
    assert len(progress) >= 3 and done == sorted(done) and done[-1] == 8  # it moved, and never backwards
    assert "completed" in progress[-1] and "/s eta" in progress[-1]
    # 8 items of the stub's usage (7 prompt + 3 completion tokens) at $0.15/$0.60 per 1M, half off
    online = 8 * (7 * 0.15 + 3 * 0.60) / 1e6
    assert summary == (
        f"{batch_id} completed: 8 completed, 0 failed; 80 tokens; "
        f"billed ${online / 2:.6f} (online ${online:.6f}, saved ${online / 2:.6f})"
    )
