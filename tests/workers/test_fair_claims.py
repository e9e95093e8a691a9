"""Claims by model and by tenant on real Redis: a node claims only its engine's models, and tenants share items by
weight whichever node claims and whatever their batches' priorities, with priority then deadline order in a tenant."""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter

import pytest
import requests
from sqlalchemy import select

from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import queued
from tidal_workers import keys
from tidal_workers.claim import ClaimLoop
from tidal_workers.context import LeaseBook
from tidal_workers.context import WorkerContext
from tidal_workers.enqueue import rebuild
from tidal_workers.gate import FixedGate
from tidal_workers.reclaim import Fate
from tidal_workers.reclaim import reclaim
from tidal_workers.renewal import Renewal
from tidal_workers.store.models import Batch

NODES = ("gpu-a", "gpu-b")  # two nodes taking turns: the tenants' passes live in Redis, not in a node


def tenants_of(rt, claims) -> list[str]:
    with rt.store.read() as s:
        owner = dict(s.execute(select(Batch.id, Batch.tenant_id)).all())
    return [owner[c.batch_id] for c in claims]


def claim_in_turns(rt, n: int, per_call: int, models=("m",)) -> list:
    """``n`` items claimed ``per_call`` at a time, the calls alternating between two nodes."""
    claims: list = []
    for k in range(0, n, per_call):
        claims += rt.queue.claim(NODES[(k // per_call) % 2], min(per_call, n - k), 30, models)
    return claims


def structure_keys(rt) -> list[str]:
    """The claim structure's keys (levels, tenants, virtual times, tenants' batches)."""
    prefixes = (keys.LEVELS_PREFIX, keys.TENANTS_PREFIX, keys.VTIME_PREFIX, keys.TENANT_BATCHES_PREFIX)
    return sorted(k for p in prefixes for k in rt.redis.scan_iter(match=p + "*"))


def test_a_tenant_with_one_batch_is_not_starved_by_one_with_a_hundred(rt, make_batch):
    heavy = [make_batch(2, tenant="acme", expires_in=3600 + i) for i in range(100)]  # 200 items, earlier deadlines
    light = make_batch(10, tenant="globex", expires_in=7200)

    claims = claim_in_turns(rt, 30, per_call=4)

    order = tenants_of(rt, claims)
    assert order[:20] == ["acme", "globex"] * 10  # items in turn (ties: tenant name), from the first claim
    assert order[20:] == ["acme"] * 10  # globex has nothing left
    acme = [c.item_id for c in claims if c.batch_id != light]
    assert acme == [i for b in heavy[:10] for i in item_ids(rt, b)]  # inside a tenant: deadline, then ordinal
    assert [c.item_id for c in claims if c.batch_id == light] == item_ids(rt, light)


@pytest.mark.parametrize(("weights", "per_call"), [((3, 1), 1), ((3, 1), 7), ((1, 1), 16), ((5, 2), 5)])
def test_tenants_share_claims_by_weight(rt, make_batch, settings, weights, per_call):
    rt.settings = settings.replace(
        tenant_limits=json.dumps({"acme": {"weight": weights[0]}, "globex": {"weight": weights[1]}})
    )
    for i in range(4):  # more than either can take in the measured claims
        make_batch(100, tenant="acme", expires_in=3600 + i)
        make_batch(100, tenant="globex", expires_in=3600 + i)

    got = Counter(tenants_of(rt, claim_in_turns(rt, 420, per_call)))

    share = got["acme"] / 420
    expected = weights[0] / sum(weights)
    assert abs(share - expected) <= 0.1 * expected
    assert abs(got["acme"] * weights[1] - got["globex"] * weights[0]) <= max(weights)  # within one turn, in fact


def test_priority_takes_no_other_tenants_turn(rt, make_batch):
    """Issue 37, M2: priority came before the tenants' turns, so a tenant with escalated batches took every item."""
    make_batch(5, tenant="acme", priority=100)
    make_batch(3, tenant="globex", priority=40)
    assert tenants_of(rt, rt.queue.claim(NODES[0], 7, 30, ["m"])) == ["acme", "globex"] * 3 + ["acme"]


def test_a_tenants_most_urgent_level_comes_first_then_its_deadlines(rt, make_batch):
    calm = make_batch(2, priority=100, expires_in=3600)
    late = make_batch(2, priority=40, expires_in=7200)
    later = make_batch(2, priority=40, expires_in=7300)
    assert [c.batch_id for c in rt.queue.claim(NODES[0], 6, 30, ["m"])] == [late] * 2 + [later] * 2 + [calm] * 2


@pytest.mark.parametrize(("weights", "per_call"), [((1, 1), 1), ((1, 1), 6), ((1, 3), 4), ((3, 1), 5)])
def test_escalated_batches_take_no_more_than_their_tenants_weight(rt, make_batch, settings, weights, per_call):
    """Issue 37, M2: a tenant whose batches sit at priority 1 and 7 shares the model with one at 100 by weight."""
    rt.settings = settings.replace(
        tenant_limits=json.dumps({"acme": {"weight": weights[0]}, "globex": {"weight": weights[1]}})
    )
    for i, priority in enumerate((1, 7, 7)):
        make_batch(100, tenant="acme", priority=priority, expires_in=3600 + i)
    make_batch(300, tenant="globex", priority=100)

    got = Counter(tenants_of(rt, claim_in_turns(rt, 240, per_call)))

    assert abs(got["acme"] * weights[1] - got["globex"] * weights[0]) <= max(weights)  # within one turn


def test_escalated_tenants_take_turns_whatever_their_levels(rt, make_batch):
    make_batch(30, tenant="globex", priority=5)
    first = make_batch(10, tenant="acme", priority=9, expires_in=3600)
    late = make_batch(10, tenant="acme", priority=1, expires_in=7200)
    claims = claim_in_turns(rt, 40, per_call=5)
    assert tenants_of(rt, claims) == ["acme", "globex"] * 20  # ties by name, as at one level
    assert [c.batch_id for c in claims if c.batch_id in (first, late)] == [late] * 10 + [first] * 10


def test_a_tenant_arriving_late_takes_turns_from_then_on_without_a_burst(rt, make_batch):
    make_batch(60, tenant="acme")
    assert len(claim_in_turns(rt, 40, per_call=8)) == 40  # acme alone: its pass is 40 ahead of nobody
    make_batch(20, tenant="globex")
    order = tenants_of(rt, claim_in_turns(rt, 20, per_call=5))
    assert Counter(order) == {"acme": 10, "globex": 10}  # joined at the level's virtual time: no 40-item burst
    assert all(a != b for a, b in itertools.pairwise(order))


def test_a_rebuild_keeps_the_tenants_passes(rt, make_batch):
    """Beat's reconcile rebuilds every minute; it must not hand a heavy tenant a fresh start each time."""
    make_batch(30, tenant="acme")
    make_batch(30, tenant="globex")
    claim_in_turns(rt, 9, per_call=3)
    before = rt.redis.zrange(keys.shares("m"), 0, -1, withscores=True)
    assert before == [("globex", 4.0), ("acme", 5.0)]
    assert rebuild(rt) == 51
    assert rt.redis.zrange(keys.shares("m"), 0, -1, withscores=True) == before


def test_a_node_claims_only_the_models_its_engine_serves(rt, make_batch):
    m = make_batch(3, model="m")
    n = make_batch(3, model="n", tenant="globex")
    nobody = make_batch(2, model="x")

    assert {c.batch_id for c in rt.queue.claim(NODES[0], 10, 30, ["m"])} == {m}
    assert rt.queue.claim(NODES[0], 10, 30, ["m"]) == []
    assert [c.batch_id for c in rt.queue.claim(NODES[1], 10, 30, ["n", "y"])] == [n] * 3
    assert rt.queue.claim(NODES[1], 10, 30, []) == []
    assert queued(rt, nobody) == 2 and nobody in rt.queue.queued_batches()  # waits, queued


def test_models_take_turns_on_a_node_serving_both(rt, make_batch):
    """Whatever their levels: a tenant escalated on one model takes no turn of the other's tenants (issue 37, M2)."""
    m = make_batch(6, model="m")
    n = make_batch(6, model="n", tenant="globex")
    urgent = make_batch(2, model="n", tenant="globex", priority=10)
    claims = rt.queue.claim(NODES[0], 10, 30, ["m", "n"])
    models = ["m" if c.batch_id == m else "n" for c in claims]
    assert Counter(models) == {"m": 5, "n": 5} and all(a != b for a, b in itertools.pairwise(models))
    assert [c.batch_id for c in claims if c.batch_id != m] == [urgent] * 2 + [n] * 3  # in a tenant, priority first


def test_the_floor_claims_only_a_served_model(rt, make_batch):
    batch = make_batch(2, model="x")
    assert rt.queue.claim_batch(NODES[0], batch, 1, 30, ["m"]) == []
    (c,) = rt.queue.claim_batch(NODES[0], batch, 1, 30, ["x"])
    assert c.batch_id == batch and queued(rt, batch) == 1


def test_rescore_moves_a_batch_between_levels_and_emptied_levels_leave_no_keys(rt, make_batch):
    a = make_batch(4, tenant="acme")
    b = make_batch(3, tenant="globex")
    deadline = float(rt.redis.hget(keys.batch(b), "score")) % 1e10
    assert rt.queue.rescore(b, 7, deadline)
    assert rt.redis.zrange(keys.levels("m"), 0, -1) == ["7", "100"]
    assert [c.batch_id for c in rt.queue.claim(NODES[0], 6, 30, ["m"])] == [a, b] * 3
    assert rt.redis.zrange(keys.levels("m"), 0, -1) == ["100"]  # level 7 emptied: gone, with its tenants
    assert rt.redis.zrange(keys.shares("m"), 0, -1) == ["acme"]  # globex left with its last batch
    assert rt.queue.drop_batch(a) == 1
    assert structure_keys(rt) == [] and rt.queue.queued_batches() == []
    assert rt.queue.claim(NODES[0], 1, 30, ["m"]) == [] and not rt.redis.exists(keys.shares("m"))  # then the passes


def test_reclaimed_items_relink_their_batch(rt, make_batch):
    batch = make_batch(1)
    (c,) = rt.queue.claim(NODES[0], 1, 0.2, ["m"])
    assert structure_keys(rt) == []
    time.sleep(0.3)
    (r,) = reclaim(rt)
    assert r.fate is Fate.requeued and r.item_id == c.item_id
    (again,) = rt.queue.claim(NODES[1], 1, 30, ["m"])
    assert again.item_id == c.item_id and again.attempt.number == 2 and again.batch_id == batch


def test_a_queue_of_layout_1_is_rebuilt_into_this_layout(rt, make_batch):
    """What the previous release leaves: a batch hash with only its score, its ready set, tidal:built a bare time."""
    batch = make_batch(3, enqueue=False)
    ids = item_ids(rt, batch)
    score = 100 * 10_000_000_000 + 2_000_000_000
    rt.redis.hset(keys.batch(batch), "score", score)
    rt.redis.zadd(keys.BATCHES, {batch: score})
    rt.redis.zadd(keys.ready(batch), {str(i): n for n, i in enumerate(ids)})
    rt.redis.set(keys.BUILT, repr(time.time()))

    assert not rt.queue.is_built()  # another layout: the next worker pass rebuilds
    assert rt.queue.claim(NODES[0], 3, 30, ["m"]) == []  # not placed by model yet
    assert rebuild(rt) == 3 and rt.queue.is_built()
    assert [c.item_id for c in rt.queue.claim(NODES[0], 3, 30, ["m"])] == ids
    assert structure_keys(rt) == []


def test_keys_of_models_and_tenants_holding_colons_do_not_collide():
    assert keys.tenants("a:1", 5) != keys.tenants("a", 1)
    assert keys.tenant_batches("x:y", 5, "t") != keys.tenant_batches("y", 5, "t:x")
    assert keys.tenant_batches("m", 100, "ténant") == "tidal:qb:100:7:ténant:m"  # length in UTF-8 bytes


def test_the_claim_loop_claims_the_models_its_engine_lists_and_publishes_them(rt, make_batch, stub):
    stub.models = ["n", "n-lora"]
    m = make_batch(2, model="m")
    n = make_batch(2, model="n-lora")
    sent: list = []
    ctx = WorkerContext(rt, LeaseBook())
    loop = ClaimLoop(ctx, FixedGate(4), lambda claims: sent.extend(claims) or claims)
    assert loop.tick(time.time()) == 2  # the first pass reads the list itself
    assert {c.batch_id for c in sent} == {n} and queued(rt, m) == 2
    assert rt.queue.served_models() == {"n", "n-lora"}
    assert rt.redis.pttl(keys.node_models(rt.settings.node)) > 0  # expires unless refreshed

    stub.models = ["m"]
    Renewal(ctx).once()  # the renewal thread re-reads it every third of a lease; the claim pass does no I/O for it
    assert loop.tick(time.time()) == 2
    assert queued(rt, m) == 0 and rt.queue.served_models() == {"m"}


def test_an_engine_that_lists_nothing_claims_nothing(rt, make_batch, stub, settings):
    rt.settings = settings.replace(vllm_url=stub.url + "/missing")  # /missing/v1/models: 404
    make_batch(2)
    loop = ClaimLoop(WorkerContext(rt, LeaseBook()), FixedGate(4), lambda claims: claims)
    assert loop.tick(time.time()) == 0
    assert rt.queue.served_models() == set()


def test_the_batch_object_says_whether_a_live_node_serves_its_model(rt, make_batch, live_api):
    served = make_batch(1, model="m")
    unserved = make_batch(1, model="x")
    rt.queue.publish_models("gpu-a", ["m"], ttl=0.5)

    def extension(batch_id: str) -> dict:
        answer = requests.get(
            f"{live_api.url}/v1/batches/{batch_id}", headers={"Authorization": "Bearer acme-key"}, timeout=30
        )
        return answer.json()["tidal"]

    assert extension(served)["model_served"] is True
    assert extension(unserved)["model_served"] is False
    listed = requests.get(f"{live_api.url}/v1/batches", headers={"Authorization": "Bearer acme-key"}, timeout=30)
    assert {b["id"]: b["tidal"]["model_served"] for b in listed.json()["data"]} == {served: True, unserved: False}
    time.sleep(0.6)  # the node stopped refreshing its record: no live node serves m
    assert extension(served)["model_served"] is False
    assert queued(rt, unserved) == 1  # waiting is not failing
