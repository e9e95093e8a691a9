"""The reclaim cap (issue 37 item 1; review H1): an item whose worker dies each time it runs it (killed, out of
memory) is not requeued for ever. Each expired lease counts one reclaim against its item in SQL; at
TIDAL_RECLAIM_LIMIT the item is a `worker_lost` error line and `tidal_worker_lost_items_total` counts it. Hand-backs
of a live worker count nothing. On real Redis, SQL and Celery: a "dying node" is one that claims with a short lease
and never renews it, as a killed worker leaves its leases."""

from __future__ import annotations

import prometheus_client
import pytest
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import wait_lease_expired
from tidal_workers import keys
from tidal_workers import reclaim as reclaim_module
from tidal_workers.handback import give_back
from tidal_workers.reclaim import Fate
from tidal_workers.reclaim import reclaim
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

DYING = "dying-node"


def lost_items() -> float:
    return prometheus_client.REGISTRY.get_sample_value("tidal_worker_lost_items_total") or 0.0


def reclaims(rt, batch: str) -> dict[str, int]:
    with rt.store.read() as s:
        return {s.get(Item, i).custom_id: s.get(Item, i).reclaims for i in item_ids(rt, batch)}


def die_holding(rt, n: int = 1) -> list:
    """A node claims ``n`` items and dies: its leases (0.2 s) are never renewed; returns once they have expired."""
    claims = rt.queue.claim(DYING, n, 0.2, ("m",))
    for c in claims:
        wait_lease_expired(rt, c.item_id)
    return claims


def test_an_item_whose_worker_dies_each_time_becomes_an_error_line_at_the_limit(rt, make_batch, worker):
    assert rt.settings.reclaim_limit == 3  # the default
    batch = make_batch(3)
    alerts = lost_items()
    for death in (1, 2):
        (claim,) = die_holding(rt)
        assert [(r.item_id, r.fate) for r in reclaim(rt)] == [(claim.item_id, Fate.requeued)]
        assert reclaims(rt, batch) == {"b0-0": death, "b0-1": 0, "b0-2": 0}  # the lowest ordinal: b0-0 each time
    (claim,) = die_holding(rt)
    assert claim.attempt.number == 3
    # The third death is reclaimed by a live worker's renewal thread, which writes it off and drains the rest.
    with worker():
        b, out, err = settled(rt, batch)
    assert (b.completed, b.failed) == (2, 1)
    (line,) = err
    assert line["custom_id"] == "b0-0" and line["error"]["code"] == "worker_lost"
    assert "3 times" in line["error"]["message"]
    assert reclaims(rt, batch) == {"b0-0": 3, "b0-1": 0, "b0-2": 0}
    with rt.store.read() as s:
        assert s.get(Item, claim.item_id).attempts == 3  # written under the attempt that died last
    assert lost_items() == alerts + 1
    assert_exactly_once(rt, batch, out, err)
    assert rt.queue.inflight(DYING) == 0 and not rt.redis.exists(keys.item(claim.item_id))


def test_a_live_workers_hand_back_counts_no_reclaim(rt, make_batch):
    """Engine outage, failed preflight, a task that never started, a stopping worker: all go through give_back."""
    batch = make_batch(1)
    for _ in range(2 * rt.settings.reclaim_limit):
        (claim,) = rt.queue.claim("live-node", 1, 30, ("m",))
        assert give_back(rt, claim.attempt) == "given_back"
    assert reclaim(rt) == [] and reclaims(rt, batch) == {"b0-0": 0}
    (claim,) = rt.queue.claim("live-node", 1, 30, ("m",))
    assert claim.attempt.number == 2 * rt.settings.reclaim_limit + 1  # fencing went on counting every claim


def test_an_item_settled_before_its_worker_died_is_forgotten_not_counted(rt, make_batch):
    batch = make_batch(2)
    settled_claim, pending_claim = die_holding(rt, 2)
    with rt.store.transaction() as s:  # its result was committed; the worker died before releasing the lease
        s.execute(update(Item).where(Item.id == settled_claim.item_id).values(status=ItemStatus.completed.value))
    fates = {r.item_id: r.fate for r in reclaim(rt)}
    assert fates == {settled_claim.item_id: Fate.settled, pending_claim.item_id: Fate.requeued}
    assert reclaims(rt, batch) == {"b0-0": 0, "b0-1": 1}
    assert not rt.redis.exists(keys.item(settled_claim.item_id))
    assert [c.item_id for c in rt.queue.claim("node-b", 5, 30, ("m",))] == [pending_claim.item_id]


def test_an_item_goes_back_uncounted_when_sql_cannot_count(rt, make_batch, monkeypatch):
    batch = make_batch(1)
    (claim,) = die_holding(rt)

    def unreachable(rt, item_ids):
        raise OperationalError("UPDATE items", {}, ConnectionError("the store is restarting"))

    monkeypatch.setattr(reclaim_module, "count_reclaims", unreachable)
    with pytest.raises(OperationalError):
        reclaim(rt)
    assert reclaims(rt, batch) == {"b0-0": 0}
    (again,) = wait_for(lambda: rt.queue.claim("node-b", 1, 30, ("m",)), 5, "the item to be claimable again")
    assert again.item_id == claim.item_id and again.attempt.number == 2
