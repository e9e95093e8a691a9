"""The Redis queue on real Redis: claim order, re-score, leases and fencing, drop, rebuild, gauges."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest
from sqlalchemy import update

from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import wait_lease_expired
from tidal_workers import keys
from tidal_workers.attempt import Attempt
from tidal_workers.attempt import parse_lease
from tidal_workers.enqueue import rebuild
from tidal_workers.metrics import register_queue_metrics
from tidal_workers.queue import WHOLE
from tidal_workers.queue import batch_score
from tidal_workers.reclaim import Fate
from tidal_workers.reclaim import reclaim
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

NODE = "test-node"
MODELS = ["m"]  # what make_batch queues


def claim_order(rt, n: int) -> list[int]:
    return [c.item_id for c in rt.queue.claim(NODE, n, 30, MODELS)]


def test_keys_are_built_in_one_place():
    assert keys.ready("batch_1") == "tidal:b:batch_1:ready"
    assert keys.item(7) == "tidal:item:7"
    assert keys.node_inflight("gpu-1") == "tidal:node:gpu-1:inflight"
    assert keys.batch("batch_1") == "tidal:batch:batch_1"


def test_claim_order_is_priority_then_deadline_then_prefix_ordinal(rt, make_batch):
    late = make_batch(3, priority=100, expires_in=7200, ordinals=[2, 0, 1])
    early = make_batch(2, priority=100, expires_in=3600, ordinals=[1, 0])
    urgent = make_batch(2, priority=50, expires_in=9000)
    late_ids, early_ids, urgent_ids = item_ids(rt, late), item_ids(rt, early), item_ids(rt, urgent)

    order = claim_order(rt, 1) + claim_order(rt, 1) + claim_order(rt, 10)  # one at a time, then across batches

    assert order == [*urgent_ids, early_ids[1], early_ids[0], late_ids[1], late_ids[2], late_ids[0]]
    assert rt.queue.queued_batches() == []


def test_rescore_reorders_queued_items_with_one_zadd(rt, make_batch):
    a = make_batch(3, priority=100, expires_in=3600)
    b = make_batch(3, priority=100, expires_in=7200)
    first = claim_order(rt, 1)
    assert first == item_ids(rt, a)[:1]

    assert rt.queue.rescore(b, priority=1, deadline=time.time() + 7200)
    assert claim_order(rt, 3) == item_ids(rt, b)  # b's queued items jump ahead of a's, all at once
    assert claim_order(rt, 5) == item_ids(rt, a)[1:]
    assert not rt.queue.rescore("batch_unknown", 1, 0)  # never resurrects a batch Redis does not queue


def test_lease_fencing_renew_complete_and_reclaim(rt, make_batch):
    batch = make_batch(2)
    first, second = rt.queue.claim(NODE, 2, 2.0, MODELS)  # long enough to renew one before it expires
    assert parse_lease(first.lease) == (NODE, 1) and first.attempt.task_id == f"item-{first.item_id}#1"
    assert rt.queue.inflight(NODE) == 2 and rt.queue.batch_inflight(batch) == 2

    assert rt.queue.renew(NODE, [second.attempt], lease_seconds=30) == []
    wait_lease_expired(rt, first.item_id)
    reclaimed = reclaim(rt)
    assert [(r.item_id, r.fate) for r in reclaimed] == [(first.item_id, Fate.requeued)]  # the renewed one stays
    assert rt.queue.inflight(NODE) == 1

    (again,) = rt.queue.claim("other-node", 5, 30, MODELS)
    assert again.item_id == first.item_id and again.attempt.number == 2
    assert not rt.queue.lease_current(first.attempt)
    assert not rt.queue.complete(first.attempt)  # the stale attempt is fenced off
    assert rt.queue.renew(NODE, [first.attempt], 30) == [first.item_id]
    assert rt.queue.complete(again.attempt)
    assert rt.queue.inflight_by_node() == {NODE: 1, "other-node": 0}


def test_complete_all_releases_a_groups_current_leases_in_order_and_fences_a_stale_one(rt, make_batch):
    make_batch(4)
    mine = rt.queue.claim(NODE, 3, 30, MODELS)
    (theirs,) = rt.queue.claim("other-node", 1, 30, MODELS)
    stale = Attempt(mine[1].item_id, mine[1].lease.rsplit("|", 1)[0] + "|0")  # not the lease the claim gave it
    attempts = [mine[0].attempt, stale, theirs.attempt, mine[2].attempt]
    assert rt.queue.complete_all(attempts) == [True, False, True, True]
    assert rt.queue.inflight_by_node() == {NODE: 1, "other-node": 0}  # only mine[1], whose lease was not given
    assert rt.queue.lease_current(mine[1].attempt)
    assert not rt.redis.exists(keys.item(mine[0].item_id), keys.item(mine[2].item_id), keys.item(theirs.item_id))
    assert rt.redis.exists(keys.item(mine[1].item_id))
    assert rt.queue.complete_all([]) == []


def test_drop_batch_forgets_queued_items_and_abandons_leased_ones(rt, make_batch):
    batch = make_batch(5)
    (leased,) = rt.queue.claim(NODE, 1, 0.2, MODELS)
    assert rt.queue.drop_batch(batch) == 4
    assert claim_order(rt, 10) == []
    wait_lease_expired(rt, leased.item_id)
    (r,) = rt.queue.take_expired()
    assert (r.attempt, r.batch_id, r.taken) == (leased.attempt, batch, False)
    assert rt.queue.batch_inflight(batch) == 0
    assert not rt.redis.exists(keys.item(leased.item_id), keys.ready(batch), keys.batch(batch))


def test_rebuild_from_sql_requeues_pending_items_not_leased(rt, make_batch):
    batch = make_batch(4, enqueue=False)
    ids = item_ids(rt, batch)
    with rt.store.transaction() as s:
        s.execute(update(Item).where(Item.id == ids[0]).values(status=ItemStatus.completed.value))
    assert rebuild(rt) == 3 and rt.queue.is_built()
    (leased,) = rt.queue.claim(NODE, 1, 30, MODELS)

    rt.redis.delete(keys.ready(batch), keys.BATCHES)  # lose the queue but not the lease
    assert rebuild(rt) == 2  # the leased item is in flight, not queued again
    assert claim_order(rt, 10) == ids[2:]
    assert leased.item_id == ids[1]

    rt.redis.flushdb()
    assert not rt.queue.is_built()
    assert rebuild(rt) == 3  # nothing is leased after data loss: every pending item is queued


def test_enqueue_of_a_large_batch_is_chunked_and_exact(rt):
    items = [(i, i, WHOLE) for i in range(12_000)]
    deadline = time.time() + 60
    assert rt.queue.enqueue_batch("batch_big", 100, deadline, items, model="m", tenant="acme") == 12_000
    assert queued(rt, "batch_big") == 12_000
    assert rt.redis.zscore(keys.BATCHES, "batch_big") == batch_score(100, deadline)


def test_gauges_show_depth_by_band_and_inflight_by_node(rt, make_batch):
    make_batch(3, priority=100)
    make_batch(2, priority=5)
    rt.queue.claim(NODE, 1, 30, MODELS)
    assert rt.queue.depth_by_band() == {"0": 0, "1-9": 1, "10-49": 0, "50-99": 0, "100": 3}

    registry = CollectorRegistry()
    register_queue_metrics(rt, registry)
    text = generate_latest(registry).decode()
    assert 'tidal_queue_depth{band="100"} 3.0' in text
    assert 'tidal_queue_depth{band="1-9"} 1.0' in text
    assert f'tidal_inflight_items{{node="{NODE}"}} 1.0' in text
