"""Expiry with the window shortened by settings; the wire value stays "24h"."""

from __future__ import annotations

import time

import pytest

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import settled
from tidal_workers.sweeps import expire_due

WINDOW = 3.0


@pytest.fixture
def settings(settings):
    return settings.replace(completion_window_seconds=WINDOW, max_inflight=2)


def test_expiry_keeps_finished_lines_and_expires_the_rest(rt, make_batch, worker, celery_app, stub):
    stub.delay = 0.5
    batch = make_batch(20)  # expires_at = now + TIDAL_COMPLETION_WINDOW_SECONDS
    assert expire_due(rt) == []
    with worker():
        wait_for(lambda: batch_row(rt, batch).completed >= 1, what="an item to finish inside the window")
        wait_for(lambda: time.time() >= batch_row(rt, batch).expires_at, what="the window to end")
        celery_app.send_task("tidal.sweep.expire")  # what beat sends to tidal.ops
        b, out, err = settled(rt, batch, ("expired",))
    assert b.completion_window == "24h" and b.expired_at and b.expires_at - b.created_at <= WINDOW + 1
    assert_exactly_once(rt, batch, out, err)
    assert 1 <= len(out) < 20 and len(out) == b.completed
    assert {line["error"]["code"] for line in err} == {"batch_expired"}
    assert rt.queue.queued_batches() == [] and expire_due(rt) == []
