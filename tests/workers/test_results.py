"""Result writes: first write wins, and a worker's group commit updates each batch's counters once per group."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from workers.worker_helpers import batch_row

from tidal_workers.policy.pricing import Usage
from tidal_workers.result import Entry
from tidal_workers.result import Outcome
from tidal_workers.result import ResultWriter
from tidal_workers.result import record
from tidal_workers.store.models import ItemStatus

NODE = "test-node"


def done(n: int) -> Outcome:
    return Outcome(ItemStatus.completed, 200, body="{}", usage=Usage(input_tokens=n, output_tokens=2 * n))


def test_a_group_commit_counts_each_first_write_once(rt, make_batch):
    batch = make_batch(20)
    claims = rt.queue.claim(NODE, 20, 30, ["m"])
    writer = ResultWriter(rt)
    try:
        with ThreadPoolExecutor(10) as pool:
            firsts = list(pool.map(lambda c: record(rt, c.item_id, c.batch_id, c.lease, done(1), writer.write), claims))
            # the same attempts again (a retried write, a zombie racing past the lease check): none lands
            again = writer.write([Entry(c.item_id, c.batch_id, c.lease, done(5)) for c in claims[:5]])
    finally:
        writer.close()
    assert firsts == [True] * 20 and again == [False] * 5
    b = batch_row(rt, batch)
    assert (b.completed, b.failed, b.input_tokens, b.output_tokens) == (20, 0, 20, 40)
    assert rt.queue.inflight(NODE) == 0  # every lease released after its write


def test_one_group_spanning_batches_counts_each_on_its_own_row(rt, make_batch):
    first, second = make_batch(2), make_batch(1)
    claims = rt.queue.claim(NODE, 3, 30, ["m"])
    failed = Outcome(ItemStatus.failed, 400, body="{}")
    writer = ResultWriter(rt)
    try:
        of_first = [c for c in claims if c.batch_id == first]
        (of_second,) = [c for c in claims if c.batch_id == second]
        outcomes = [(of_first[0], done(3)), (of_first[1], failed), (of_second, done(7))]
        assert writer.write([Entry(c.item_id, c.batch_id, c.lease, o) for c, o in outcomes]) == [True] * 3
    finally:
        writer.close()
    a, b = batch_row(rt, first), batch_row(rt, second)
    assert (a.completed, a.failed, a.input_tokens) == (1, 1, 3)
    assert (b.completed, b.failed, b.input_tokens) == (1, 0, 7)
