"""Processes that die: kill -9 of a `tidal worker` mid-batch, and two `tidal beat`s that must not double-fire."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

from sqlalchemy import select

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import held_from
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import spawn
from tidal_workers.enqueue import enqueue_batch
from tidal_workers.store.models import Item
from tidal_workers.task_names import OPS_QUEUE


def test_kill_9_mid_batch_loses_nothing_and_duplicates_nothing(
    rt, make_batch, worker, stub, settings, children, tmp_path
):
    """node-a is killed while the engine holds one of its requests unanswered: that item is unsettled by
    construction, so the survivor must run it again under a new attempt. (Waiting on node-a's lease count instead
    raced: the leases of items already committed but not yet released count too, and killing then leaves nothing
    to rerun.)"""
    stub.delay = 2.0  # longer than a lease: node-a must renew its leases mid-request
    batch = make_batch(24)
    doomed = spawn(
        settings.replace(node="node-a", request_timeout_seconds=60),
        "worker",
        "--loglevel=warning",
        log=tmp_path / "a.log",
    )
    children.append(doomed)
    wait_for(lambda: batch_row(rt, batch).completed >= 4, timeout=120, what="node-a to make progress")
    stub.hold_answers()
    wait_for(lambda: held_from(rt, stub, "node-a"), timeout=60, what="node-a to have a request in the engine")
    held = stub.held()
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(10)
    stub.delay = 0.05
    stub.release_answers()

    with worker():  # a survivor on another node reclaims node-a's leases once they expire
        b, out, err = settled(rt, batch)
    assert (b.completed, b.failed, err) == (24, 0, [])
    assert_exactly_once(rt, batch, out, err)
    with rt.store.read() as s:
        attempts = s.scalars(select(Item.attempts).where(Item.batch_id == batch, Item.custom_id.in_(held))).all()
    assert attempts and min(attempts) >= 2  # the held items ran again, under a new attempt, on the survivor
    assert rt.queue.inflight("node-a") == 0


def test_a_revoked_task_gives_its_item_back_within_the_lease(rt, make_batch, worker, stub, settings):
    """A run_item revoked before it starts (from Flower, say) never runs: the renewal thread gives its claim back
    about a lease after the claim, and the item runs again as attempt 2 (it is not renewed for ever)."""
    from celery.worker import state

    batch = make_batch(2, enqueue=False)
    doomed = f"item-{item_ids(rt, batch)[0]}#1"  # the task id the claim will publish
    # What a revoke leaves in the worker, held before it starts: its first pass rebuilds the queue from SQL and
    # claims at once, so a revoke broadcast to the running worker could arrive after the task.
    state.revoked.add(doomed)
    try:
        with worker():
            enqueue_batch(rt, batch)
            claimed = time.monotonic()
            b, out, err = settled(rt, batch, timeout=10 * settings.lease_seconds)
            back = time.monotonic() - claimed
    finally:
        state.revoked.discard(doomed)  # the worker state is the process's: later tests must not inherit it
    assert (b.completed, b.failed, err) == (2, 0, [])
    assert_exactly_once(rt, batch, out, err)
    with rt.store.read() as s:
        assert s.get(Item, item_ids(rt, batch)[0]).attempts == 2  # the revoked attempt 1 never ran; attempt 2 did
    assert len(stub.requests) == 2
    print(f"\nrevoked task: batch completed {back:.1f} s after the claim (lease {settings.lease_seconds} s)")


def _reclaim_senders(rt) -> list[str]:
    """The sender of each reclaim sweep beat has queued, in order: Celery stamps ``origin`` = gen<pid>@<host>."""
    messages = [json.loads(m) for m in rt.redis.lrange(OPS_QUEUE, 0, -1)]
    return [m["headers"]["origin"] for m in messages if m["headers"]["task"] == "tidal.sweep.reclaim"]


def test_two_beats_fire_once_and_the_standby_takes_over(rt, settings, children, tmp_path):
    """Only the beat holding the lock sends; killed, the standby sends from the lock's timeout on.

    Asserted on who sent each sweep (events), not on how many sweeps fit a short window.
    """
    for name in ("one", "two"):
        children.append(spawn(settings, "beat", "--loglevel=warning", log=tmp_path / f"beat-{name}.log"))
    wait_for(lambda: len(_reclaim_senders(rt)) >= 4, timeout=120, what="four sweeps")
    senders = set(_reclaim_senders(rt))
    assert len(senders) == 1, f"two beats both sent sweeps: {senders}"
    (leader,) = senders
    by_origin = {f"gen{p.pid}@{socket.gethostname()}": p for p in children}
    assert leader in by_origin, f"sweeps from {leader}, beats {sorted(by_origin)}"
    os.kill(by_origin[leader].pid, signal.SIGKILL)
    by_origin[leader].wait(10)
    wait_for(
        lambda: set(_reclaim_senders(rt)) - senders,
        timeout=settings.beat_lock_seconds + 60,
        what="the standby beat to take over",
    )
