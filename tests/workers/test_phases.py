"""A-P, claiming by phase, on real Redis, SQL and a real Celery worker: ingest decides and stores each item's phase,
a split item is queued as its prefill and claimed only under prefill slack (or urgency), its answered prefill
queues its decode and writes nothing, the decode is claimed under decode slack (or urgency) and recorded once,
and a rebuild from SQL puts every item back as its phase."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import select
from sqlalchemy import update

from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import validating_batch
from tests.support.worker_helpers import wait_lease_expired
from tidal_workers import keys
from tidal_workers.claim import ClaimLoop
from tidal_workers.context import WorkerContext
from tidal_workers.enqueue import enqueue_batch
from tidal_workers.enqueue import rebuild
from tidal_workers.execute import prefilled
from tidal_workers.gate import FixedGate
from tidal_workers.gate import prefill_per_step
from tidal_workers.gate import step_counters
from tidal_workers.ingest import ingest_batch
from tidal_workers.leases import LeaseBook
from tidal_workers.policy.laxity import PRIORITY_MAX
from tidal_workers.policy.phase import SplitConfig
from tidal_workers.reclaim import Fate
from tidal_workers.reclaim import reclaim
from tidal_workers.store.models import Batch
from tidal_workers.store.models import Item

NODE = "test-node"
MODELS = ["m"]
PREFILL, DECODE = "prefill", "decode"


@pytest.fixture
def freezing(rt, settings, tmp_path):
    """The fleet's engines freeze (TIDAL_KV_FREEZE_DIR set): ingest may split."""
    rt.settings = settings.replace(models="m", kv_freeze_dir=str(tmp_path / "frozen"))
    return rt


def phases(rt, batch_id: str) -> list[str]:
    with rt.store.read() as s:
        return list(s.scalars(select(Item.phase).where(Item.batch_id == batch_id).order_by(Item.line)))


def split(rt, batch_id: str, phase: str = PREFILL) -> None:
    """Mark every item of a batch made by ``make_batch(enqueue=False)`` as split, then queue it."""
    with rt.store.transaction() as s:
        s.execute(update(Item).where(Item.batch_id == batch_id).values(phase=phase))
        s.execute(update(Batch).where(Batch.id == batch_id).values(phase_split="always"))
    enqueue_batch(rt, batch_id)


def waiting(rt, batch_id: str, phase: str) -> int:
    return int(rt.redis.zcard(keys.phase_ready(batch_id, phase)))


def _line(custom_id: str, prompt_chars: int) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * prompt_chars}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}).encode()


# Prompts of about 4, 604 and 2,254 estimated tokens (4 bytes a token, 4 a message): short, splittable, over τ.
LINES = b"\n".join(_line(c, n) for c, n in (("short", 1), ("long", 2400), ("over-tau", 9000))) + b"\n"


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("auto", ["whole", PREFILL, "whole"]),  # only a prompt worth freezing, and only one τ can freeze
        ("always", [PREFILL, PREFILL, "whole"]),
        ("never", ["whole", "whole", "whole"]),
    ],
)
def test_ingest_stores_each_items_phase_and_queues_a_split_one_as_its_prefill(freezing, mode, expected):
    rt = freezing
    batch = validating_batch(rt, LINES)
    with rt.store.transaction() as s:
        s.get(Batch, batch).phase_split = mode
    ingest_batch(rt, batch)
    assert phases(rt, batch) == expected
    assert waiting(rt, batch, PREFILL) == expected.count(PREFILL) and queued(rt, batch) == expected.count("whole")
    assert waiting(rt, batch, DECODE) == 0


def test_ingest_splits_nothing_unless_the_engines_freeze(rt, settings):
    rt.settings = settings.replace(models="m", kv_freeze_dir="")
    batch = validating_batch(rt, LINES)
    with rt.store.transaction() as s:
        s.get(Batch, batch).phase_split = "always"
    ingest_batch(rt, batch)
    assert phases(rt, batch) == ["whole"] * 3 and queued(rt, batch) == 3


def test_ingest_splits_nothing_for_a_tenant_whose_frozen_kv_fills_its_stored_bytes(freezing):
    """Frozen KV counts against the tenant's stored bytes: at the limit, no item freezes more."""
    rt = freezing
    held = validating_batch(rt, LINES)
    limit = rt.settings.limits_for("acme").stored_bytes
    with rt.store.transaction() as s:
        s.get(Batch, held).kv_stored_bytes = limit  # as beat's retention sweep measured an earlier batch's folder
    batch = validating_batch(rt, LINES)
    with rt.store.transaction() as s:
        s.get(Batch, batch).phase_split = "always"
    ingest_batch(rt, batch)
    assert phases(rt, batch) == ["whole"] * 3 and queued(rt, batch) == 3


def test_split_items_are_claimed_by_phase_only_and_requeued_as_their_decode(rt, make_batch):
    whole = make_batch(2)
    batch = make_batch(3, enqueue=False)
    split(rt, batch)
    ids = item_ids(rt, batch)
    assert rt.queue.depth_by_band()["100"] == 5 and set(rt.queue.queued_batches()) == {whole, batch}
    assert {c.batch_id for c in rt.queue.claim(NODE, 10, 30, MODELS)} == {whole}  # whole claims never take them
    assert rt.queue.queued_batches() == [batch]  # still indexed while its split items wait
    assert rt.queue.claim_phase(NODE, DECODE, 10, 30, MODELS) == []
    first, second = rt.queue.claim_phase(NODE, PREFILL, 2, 30, MODELS)
    assert [first.item_id, second.item_id] == ids[:2] and first.batch_id == batch

    assert prefilled(rt, first.attempt) == "prefilled"
    assert phases(rt, batch) == [DECODE, PREFILL, PREFILL] and waiting(rt, batch, DECODE) == 1
    assert prefilled(rt, first.attempt) == "stale"  # its lease went with it
    (decode,) = rt.queue.claim_phase(NODE, DECODE, 10, 30, MODELS)
    assert decode.item_id == first.item_id and decode.attempt.number == 2

    rt.queue.drop_batch(batch)  # cancel: the split items go with the whole ones
    assert rt.queue.claim_phase(NODE, PREFILL, 10, 30, MODELS) == []
    assert not rt.redis.exists(keys.phase_ready(batch, PREFILL), keys.phase_batches(PREFILL, "m"))
    assert rt.queue.queued_batches() == [] and rt.redis.keys(keys.PHASE_BATCHES_PREFIX + "*") == []
    assert prefilled(rt, second.attempt) == "abandoned"


def test_one_claim_takes_each_phases_split_items_in_order_then_whole_items(rt, make_batch):
    """The claim loop's pass is one CLAIM call: the phases it admits, decodes first, then whole items."""
    whole = make_batch(2)
    decodes, prefills = make_batch(1, enqueue=False), make_batch(2, enqueue=False)
    split(rt, decodes, DECODE)
    split(rt, prefills)
    both = [(DECODE, PRIORITY_MAX), (PREFILL, PRIORITY_MAX)]
    got = rt.queue.claim(NODE, 4, 30, MODELS, phases=both)
    assert [c.item_id for c in got] == item_ids(rt, decodes) + item_ids(rt, prefills) + item_ids(rt, whole)[:1]
    assert rt.queue.claim(NODE, 10, 30, MODELS, phases=both, whole=False) == []  # no split item is left
    assert [c.item_id for c in rt.queue.claim(NODE, 10, 30, MODELS, phases=both)] == item_ids(rt, whole)[1:]


def test_a_phase_admitted_only_for_urgent_batches_takes_none_of_a_calm_one(rt, make_batch):
    whole, calm = make_batch(1), make_batch(1, enqueue=False)
    split(rt, calm)
    assert [c.batch_id for c in rt.queue.claim(NODE, 2, 30, MODELS, phases=[(PREFILL, 50)])] == [whole]
    assert waiting(rt, calm, PREFILL) == 1


def test_phase_claims_follow_priority_and_a_rescore_and_an_urgency_bound(rt, make_batch):
    late, soon = make_batch(1, enqueue=False), make_batch(1, enqueue=False)
    split(rt, late)
    split(rt, soon)
    assert rt.queue.rescore(soon, priority=40, deadline=time.time() + 60)
    assert rt.queue.queued_batches() == [soon, late]
    assert rt.queue.claim_phase(NODE, PREFILL, 10, 30, MODELS, max_priority=39) == []
    (urgent,) = rt.queue.claim_phase(NODE, PREFILL, 1, 30, MODELS, max_priority=50)
    assert urgent.batch_id == soon
    assert [c.batch_id for c in rt.queue.claim_phase(NODE, PREFILL, 10, 30, MODELS)] == [late]
    assert rt.queue.queued_batches() == [] and rt.redis.keys(keys.PHASE_BATCHES_PREFIX + "*") == []


def test_the_floor_takes_an_urgent_batchs_split_items_too(rt, make_batch):
    """The floor (past a closed gate) serves urgency, not slack: whole items, then decodes, then prefills."""
    batch = make_batch(3, enqueue=False)
    split(rt, batch)
    ids = item_ids(rt, batch)
    with rt.store.transaction() as s:
        s.execute(update(Item).where(Item.id == ids[2]).values(phase=DECODE))
    enqueue_batch(rt, batch)
    assert [c.item_id for c in rt.queue.claim_batch(NODE, batch, 2, 30, MODELS)] == [ids[2], ids[0]]
    assert [c.item_id for c in rt.queue.claim_batch(NODE, batch, 5, 30, MODELS)] == [ids[1]]
    assert rt.queue.queued_batches() == [] and rt.redis.keys(keys.PHASE_BATCHES_PREFIX + "*") == []


def test_an_expired_split_lease_goes_back_as_its_phase(rt, make_batch):
    batch = make_batch(1, enqueue=False)
    split(rt, batch, DECODE)
    (claim,) = rt.queue.claim_phase(NODE, DECODE, 1, 0.2, MODELS)
    wait_lease_expired(rt, claim.item_id)
    (r,) = reclaim(rt)
    assert r.fate is Fate.requeued and waiting(rt, batch, DECODE) == 1 and queued(rt, batch) == 0


def test_rebuild_from_sql_restores_each_items_phase(rt, make_batch):
    batch = make_batch(3, enqueue=False)
    split(rt, batch)
    ids = item_ids(rt, batch)
    with rt.store.transaction() as s:  # one prefill answered (SQL moved on), one item never split
        s.execute(update(Item).where(Item.id == ids[0]).values(phase=DECODE))
        s.execute(update(Item).where(Item.id == ids[2]).values(phase="whole"))
    assert rebuild(rt) == 3  # Redis still held all three as prefills: each leaves the set it was in
    assert [c.item_id for c in rt.queue.claim_phase(NODE, PREFILL, 10, 30, MODELS)] == [ids[1]]
    assert [c.item_id for c in rt.queue.claim_phase(NODE, DECODE, 10, 30, MODELS)] == [ids[0]]
    assert [c.item_id for c in rt.queue.claim(NODE, 10, 30, MODELS)] == [ids[2]]

    rt.redis.flushdb()  # data loss: nothing is leased any more, every pending item goes back as its phase
    assert rebuild(rt) == 3
    assert (waiting(rt, batch, PREFILL), waiting(rt, batch, DECODE), queued(rt, batch)) == (1, 1, 1)
    assert rt.queue.queued_batches() == [batch]


class Gate(FixedGate):
    """A fixed target with the engine's prefill slack as the test sets it (the AIMD gate reads it from /metrics)."""

    def __init__(self, target: int, slack: bool):
        super().__init__(target)
        self.slack = slack

    def prefill_slack(self, cfg: SplitConfig) -> bool:
        return self.slack


def claim_pass(rt, gate: Gate) -> tuple[ClaimLoop, list]:
    sent: list = []

    def send(claims):
        sent.extend(claims)
        return claims

    loop = ClaimLoop(WorkerContext(rt, LeaseBook()), gate, send)
    loop.tick(time.time())
    return loop, sent


def test_a_prefill_is_claimed_only_under_prefill_slack_or_urgency(rt, make_batch, settings):
    rt.settings = settings.replace(dispatch_prefetch=0, floor_rate=0.0)
    batch = make_batch(2, enqueue=False)
    split(rt, batch)
    assert claim_pass(rt, Gate(4, slack=False))[1] == []
    _, sent = claim_pass(rt, Gate(1, slack=True))
    assert [c.item_id for c in sent] == item_ids(rt, batch)[:1]
    assert rt.queue.rescore(batch, priority=50, deadline=time.time() + 60)  # urgency 0.5: slack or not
    _, sent = claim_pass(rt, Gate(4, slack=False))
    assert [c.item_id for c in sent] == item_ids(rt, batch)[1:]


def test_a_decode_is_claimed_under_decode_slack_or_urgency(rt, make_batch, settings):
    rt.settings = settings.replace(dispatch_prefetch=2, floor_rate=0.0)
    whole = make_batch(1)
    lax, urgent = make_batch(2, enqueue=False), make_batch(1, enqueue=False)
    loop, sent = claim_pass(rt, Gate(1, slack=True))
    assert [c.item_id for c in sent] == item_ids(rt, whole)  # the target is full
    split(rt, lax, DECODE)
    split(rt, urgent, DECODE)
    loop.tick(time.time())  # room in the prefetch, but no decode slack and no urgency: the decodes wait
    assert len(sent) == 1
    assert rt.queue.rescore(urgent, priority=45, deadline=time.time() + 60)  # urgency past 0.5
    loop.tick(time.time())
    assert [c.item_id for c in sent[1:]] == item_ids(rt, urgent)
    loop.gate = Gate(4, slack=True)  # the target exceeds what the node holds: decode slack
    loop.tick(time.time())
    assert [c.item_id for c in sent[2:]] == item_ids(rt, lax)


def test_prefill_tokens_per_step_from_the_engines_counters():
    page = 'vllm:prompt_tokens_total{{engine="0"}} {}\nvllm:iteration_tokens_total_count{{engine="0"}} {}\n'
    before, after = step_counters(page.format(1000, 10)), step_counters(page.format(1600, 30))
    assert (before, prefill_per_step(before, after)) == ((1000, 10), 30.0)
    assert prefill_per_step(after, after) == 0.0  # no step taken: idle, all slack
    assert prefill_per_step(None, after) is None and prefill_per_step(after, before) is None  # none yet; a restart
    assert step_counters('vllm:num_requests_running{engine="0"} 1\n') is None  # an engine that does not say


def test_a_batch_split_always_completes_every_line_once_with_its_decode_recorded(rt, make_batch, worker, stub):
    batch = make_batch(4, max_tokens=16, enqueue=False)
    split(rt, batch)
    with worker():
        b, out, err = settled(rt, batch)
    assert (b.status, b.completed, b.failed, err) == ("completed", 4, 0, [])
    assert_exactly_once(rt, batch, out, err)
    assert phases(rt, batch) == [DECODE] * 4
    assert (b.input_tokens, b.cached_tokens, b.output_tokens) == (4 * 7, 4 * 2, 4 * 3)  # the decode's, once
    tag = {"tidal_freeze": batch}
    prefills = [r for r in stub.requests if r["max_tokens"] == 1]
    decodes = [r for r in stub.requests if r["max_tokens"] == 16]
    assert len(prefills) >= 4 and len(decodes) >= 4 and len(prefills) + len(decodes) == len(stub.requests)
    assert all(r["kv_transfer_params"] == tag for r in stub.requests)
    assert {r["messages"][0]["content"] for r in prefills} == {line["custom_id"] for line in out}
