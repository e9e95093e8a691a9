"""The laxity re-score on real SQL and Redis, on a simulated clock: escalation, queue order, what vLLM is sent."""

from __future__ import annotations

import math

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest
from sqlalchemy import update

from config.celery import celery_config
from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import settled
from tidal_engine.serve import free_port
from tidal_workers import keys
from tidal_workers.metrics import BatchCollector
from tidal_workers.queue import score_priority
from tidal_workers.rescore import rescore
from tidal_workers.store.models import Batch

NODE = "test-node"


@pytest.fixture
def settings(settings):
    """One item in flight at a time, so the order of submissions is the order of claims."""
    return settings.replace(max_inflight=1, worker_threads=1, metrics_bind=f"127.0.0.1:{free_port()}")


def set_counts(rt, batch_id: str, **values) -> None:
    with rt.store.transaction() as s:
        s.execute(update(Batch).where(Batch.id == batch_id).values(**values))


def pass_for(rt, batch_id: str, now: float):
    (r,) = [r for r in rescore(rt, now) if r.batch_id == batch_id]
    return r


def test_a_healthy_batch_stays_at_100_with_constant_laxity(rt, make_batch):
    batch = make_batch(4)
    set_counts(rt, batch, total=20_000)
    t0 = batch_row(rt, batch).expires_at - 24 * 3600
    seen = []
    for k in range(61):  # ten minutes at 10 items/s, a pass every 10 s
        set_counts(rt, batch, completed=100 * k - 3 * (k // 2), failed=3 * (k // 2))
        seen.append(pass_for(rt, batch, t0 + 10 * k))
    assert {r.priority for r in seen} == {100} and not any(r.moved for r in seen)
    assert seen[0].observed_rate is None and seen[0].laxity_seconds == pytest.approx(24 * 3600)
    warm = seen[5:]
    assert all(r.observed_rate == pytest.approx(10.0) for r in warm)
    assert max(r.laxity_seconds for r in warm) - min(r.laxity_seconds for r in warm) < 1.0  # the time terms cancel
    b = batch_row(rt, batch)
    assert (b.priority, b.observed_rate) == (100, pytest.approx(10.0))
    assert b.laxity_seconds == pytest.approx(24 * 3600 - 600 - 1_400, abs=1)
    assert rt.queue.urgent() == set()


def test_a_stalled_batch_escalates_to_the_floor_and_its_queue_score_follows(rt, make_batch):
    batch = make_batch(4)
    set_counts(rt, batch, total=100_000)
    t0 = batch_row(rt, batch).expires_at - 24 * 3600
    seen = []
    for k in range(121):  # 10 items/s for ten minutes, then nothing: a pass every 30 s for an hour
        set_counts(rt, batch, completed=300 * min(k, 20))
        seen.append(pass_for(rt, batch, t0 + 30 * k))
    priorities = [r.priority for r in seen]
    assert priorities[:40] == [100] * 40  # the first 20 minutes: healthy, then still above the horizon
    assert priorities == sorted(priorities, reverse=True)  # only ever escalates while stalled
    assert priorities[-1] == rt.settings.batch_priority_min and seen[-1].urgency == pytest.approx(1.0)
    moved = [r.priority for r in seen if r.moved]
    assert moved == sorted(set(priorities) - {100}, reverse=True)  # one score change per new priority
    assert score_priority(rt.redis.hget(keys.batch(batch), "score")) == priorities[-1]
    first_urgent = next(r for r in seen if r.urgency >= rt.settings.floor_urgency)
    assert first_urgent.priority <= 11
    assert rt.queue.urgent() == {batch}
    assert batch_row(rt, batch).priority == priorities[-1]


def test_a_rescore_moves_the_queue_score_but_takes_no_other_tenants_turn(rt, make_batch):
    on_time = make_batch(3, expires_in=20 * 3600)
    behind = make_batch(3, tenant="globex")  # the later deadline: claimed second, until it falls behind
    set_counts(rt, behind, total=1_000_000)
    t0 = batch_row(rt, behind).expires_at - 24 * 3600
    assert rt.queue.queued_batches() == [on_time, behind]  # EDF at equal priority
    for k in range(4):  # one item a second: a million items will not fit the window
        set_counts(rt, behind, completed=60 * k)
        rescore(rt, t0 + 60 * k)
    assert batch_row(rt, behind).priority == 1 and batch_row(rt, on_time).priority == 100
    assert rt.queue.queued_batches() == [behind, on_time]
    claimed = [c.item_id for c in rt.queue.claim(NODE, 6, 30, ["m"])]
    # Escalated, globex is sent to vLLM at priority 1, but takes its turns, not acme's (issue 37, M2).
    assert claimed == [i for pair in zip(item_ids(rt, on_time), item_ids(rt, behind)) for i in pair]


def test_a_batch_waiting_behind_its_siblings_is_not_urgent(rt, make_batch):
    """Issue 37, M2: a tenant's claims drain its batches earliest deadline first, so all but one complete nothing
    for a while. Judged batch by batch they read rate 0 after a tau and went to priority 1 (and to the floor);
    judged as the tenant's schedule at the tenant's rate (10 items/s, 24,000 items: 40 minutes of a 24 h
    window) none moves. A batch that finishes and leaves between two passes still counts its last items."""
    size, per_pass, step = 6_000, 600, 60.0
    batches = [make_batch(2) for _ in range(4)]
    for b in batches:
        set_counts(rt, b, total=size)
    t0 = batch_row(rt, batches[0]).expires_at - 24 * 3600
    ids = sorted(batches)  # equal deadlines: the queue drains them in id order
    for k in range(40):
        done = per_pass * k
        for i, b in enumerate(ids):
            mine = min(size, max(0, done - size * i))
            status = "completed" if mine == size else "in_progress"
            set_counts(rt, b, completed=mine, status=status)
        seen = rescore(rt, t0 + step * k)
        assert {r.priority for r in seen} == {100}, k
        assert rt.queue.urgent() == set()
        if k >= 1:  # equal deadlines: every open batch has the slack of the tenant's last item
            expected = 24 * 3600 - step * k - (4 * size - done) / 10.0  # at the tenant's rate, no item lost
            assert [r.laxity_seconds for r in seen] == [pytest.approx(expected, abs=1.0)] * len(seen), k


def test_each_item_is_sent_at_the_priority_current_when_it_is_submitted(rt, make_batch, stub, worker):
    stub.delay = 0.3
    batch = make_batch(10)
    expires_at = batch_row(rt, batch).expires_at
    with worker():
        wait_for(lambda: len(stub.requests) >= 2, what="the first submissions")
        (r,) = rescore(rt, now=expires_at - 600)  # ten minutes left: urgent
        sent_before = len(stub.requests)
        settled(rt, batch)
    sent = [body["priority"] for body in stub.requests]
    assert r.moved and r.priority < 10
    assert sent[:2] == [100, 100]
    # One item may have read the old priority just before the re-score committed; every later one has the new.
    assert sent[sent_before + 1 :] and set(sent[sent_before + 1 :]) == {r.priority}
    assert set(sent) <= {100, r.priority} and sent == sorted(sent, reverse=True)


def test_the_api_and_the_gauges_show_the_current_sla_state(rt, make_batch, live_api, metrics_api):
    batch = make_batch(4)
    set_counts(rt, batch, total=1_000_000)
    t0 = batch_row(rt, batch).expires_at - 24 * 3600
    rescore(rt, t0)
    set_counts(rt, batch, completed=120)
    (r,) = rescore(rt, t0 + 60)  # 2 items/s: 500,000 s to drain, far past the window

    got = requests.get(
        f"{live_api.url}/v1/batches/{batch}", headers={"Authorization": "Bearer acme-key"}, timeout=30
    ).json()["tidal"]
    assert r.observed_rate == pytest.approx(2.0) and r.priority == 1
    assert got["priority"] == 1 and got["observed_rate"] == pytest.approx(2.0)
    assert got["laxity_seconds"] == pytest.approx(24 * 3600 - 60 - (1_000_000 - 120) / 2.0)

    registry = CollectorRegistry()
    registry.register(BatchCollector(rt.store))
    text = generate_latest(registry).decode()
    assert f'tidal_batch_priority{{batch="{batch}"}} 1.0' in text
    assert f'tidal_batch_observed_rate{{batch="{batch}"}} 2.0' in text
    assert f'tidal_batch_laxity_seconds{{batch="{batch}"}} {got["laxity_seconds"]!r}' in text
    api_text = requests.get(f"{metrics_api.url}/metrics", timeout=30).text  # the API's metrics port
    assert f'tidal_batch_priority{{batch="{batch}"}} 1.0' in api_text


def test_a_batch_that_completes_nothing_for_a_tau_reads_rate_0_and_null_laxity(rt, make_batch):
    batch = make_batch(4)
    t0 = batch_row(rt, batch).expires_at - 24 * 3600
    rescore(rt, t0)
    (r,) = rescore(rt, t0 + rt.settings.rate_tau_seconds + 1)
    assert r.observed_rate == 0.0 and r.laxity_seconds is None and r.priority == 1  # infinite drain
    b = batch_row(rt, batch)
    assert b.observed_rate == 0.0 and b.laxity_seconds is None
    assert math.isclose(r.urgency, 1.0)


def test_estimator_state_survives_between_passes_and_its_loss_only_resets_the_estimate(rt, make_batch):
    batch = make_batch(4)
    set_counts(rt, batch, total=10_000)
    t0 = batch_row(rt, batch).expires_at - 24 * 3600
    rescore(rt, t0)
    set_counts(rt, batch, completed=50)
    assert pass_for(rt, batch, t0 + 10).observed_rate == pytest.approx(5.0)
    ttl = rt.redis.ttl(keys.rate(batch))
    assert 0 < ttl <= 4 * rt.settings.rate_tau_seconds
    rt.redis.delete(keys.rate(batch))
    set_counts(rt, batch, completed=100)
    assert pass_for(rt, batch, t0 + 20).observed_rate is None  # a new baseline, no rate yet


def test_beat_schedules_the_rescore(settings):
    entry = celery_config(settings)["beat_schedule"]["tidal-rescore"]
    assert entry["task"] == "tidal.sweep.rescore" and entry["schedule"] == settings.rescore_seconds
