"""Result writes: first write wins, and a worker's group commit updates each batch's counters once per group."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import ops_batch_ids
from tidal_workers import result
from tidal_workers.policy.pricing import Usage
from tidal_workers.result import Entry
from tidal_workers.result import Outcome
from tidal_workers.result import ResultWriter
from tidal_workers.result import record
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus
from tidal_workers.task_names import FINALIZE

NODE = "test-node"


def done(n: int) -> Outcome:
    return Outcome(ItemStatus.completed, 200, body="{}", usage=Usage(input_tokens=n, output_tokens=2 * n))


def test_a_group_commit_counts_each_first_write_once(rt, make_batch):
    batch = make_batch(20)
    claims = rt.queue.claim(NODE, 20, 30, ["m"])
    writer = ResultWriter(rt)
    try:
        with ThreadPoolExecutor(10) as pool:
            firsts = list(pool.map(lambda c: record(rt, Entry(c.attempt, c.batch_id, done(1)), writer.write), claims))
            # the same attempts again (a retried write, a zombie racing past the lease check): none lands
            again = writer.write([Entry(c.attempt, c.batch_id, done(5)) for c in claims[:5]])
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
        assert writer.write([Entry(c.attempt, c.batch_id, o) for c, o in outcomes]) == [True] * 3
    finally:
        writer.close()
    a, b = batch_row(rt, first), batch_row(rt, second)
    assert (a.completed, a.failed, a.input_tokens) == (1, 1, 3)
    assert (b.completed, b.failed, b.input_tokens) == (1, 0, 7)


def test_an_idle_writer_writes_on_the_callers_thread_and_a_busy_one_groups_what_arrives(rt, make_batch, monkeypatch):
    """The first outcome is written on its caller's thread (no hand-off); the four that arrive while it is being
    written wait and go out together in the next transaction, written by one of their callers."""
    from tidal_workers import result

    make_batch(5)
    claims = rt.queue.claim(NODE, 5, 30, ["m"])
    writer = ResultWriter(rt)
    groups: list[tuple[str, int]] = []  # (writing thread, outcomes in its transaction)
    first_under_way, rest_queued = threading.Event(), threading.Event()
    real = result.write_outcomes

    def write_outcomes(rt_, entries):
        groups.append((threading.current_thread().name, len(entries)))
        if len(groups) == 1:
            first_under_way.set()
            assert rest_queued.wait(30), "the other four outcomes never queued"
        return real(rt_, entries)

    monkeypatch.setattr(result, "write_outcomes", write_outcomes)
    try:
        with ThreadPoolExecutor(5, thread_name_prefix="caller") as pool:
            first = pool.submit(record, rt, Entry(claims[0].attempt, claims[0].batch_id, done(1)), writer.write)
            assert first_under_way.wait(30)
            rest = [pool.submit(record, rt, Entry(c.attempt, c.batch_id, done(1)), writer.write) for c in claims[1:]]
            wait_for(
                lambda: len(writer._queue) >= 4, 30, "the four outcomes to queue behind the first write", every=0.01
            )
            rest_queued.set()
            assert [f.result(30) for f in [first, *rest]] == [True] * 5
    finally:
        writer.close()
    assert [n for _, n in groups] == [1, 4]
    assert all(name.startswith("caller") for name, _ in groups)  # no writer thread of its own
    assert rt.queue.inflight(NODE) == 0


def finalize_requests(rt) -> list[str]:
    """Batch ids of the `tidal.finalize` messages waiting in the ops queue (taken out of it)."""
    return ops_batch_ids(rt, FINALIZE)


def test_the_write_of_a_batchs_last_item_asks_for_its_finalize_from_the_counts_it_returned(rt, make_batch):
    batch = make_batch(3)
    claims = rt.queue.claim(NODE, 3, 30, ["m"])
    finalize_requests(rt)
    assert record(rt, Entry(claims[0].attempt, batch, done(1)))
    assert finalize_requests(rt) == []  # two items to go
    writer = ResultWriter(rt)
    try:  # the last two in one group: one request for the batch
        assert writer.write([Entry(c.attempt, batch, done(1)) for c in claims[1:]]) == [True, True]
    finally:
        writer.close()
    assert finalize_requests(rt) == [batch]
    assert rt.queue.inflight(NODE) == 0  # released before the request


def test_the_next_group_is_written_while_the_last_one_releases_its_leases(rt, make_batch, monkeypatch):
    """Answers of one step: the second's transaction runs during the first's Redis round trip, not after it, and
    each group's leases are released only after its own commit."""
    from tidal_workers import result

    make_batch(2)
    first, second = rt.queue.claim(NODE, 2, 30, ["m"])
    order: list[tuple[str, int]] = []
    first_releasing, second_committed = threading.Event(), threading.Event()
    real_write, real_release = result.write_outcomes, result.release

    def write_outcomes(rt_, entries):
        out = real_write(rt_, entries)
        order.append(("commit", entries[0].attempt.item_id))
        if entries[0].attempt.item_id == second.item_id:
            second_committed.set()
        return out

    def release(rt_, entries, due):
        order.append(("release", entries[0].attempt.item_id))
        if entries[0].attempt.item_id == first.item_id:
            first_releasing.set()
            assert second_committed.wait(30), "the second group's write waited for the first group's release"
        real_release(rt_, entries, due)

    monkeypatch.setattr(result, "write_outcomes", write_outcomes)
    monkeypatch.setattr(result, "release", release)
    writer = ResultWriter(rt)
    try:
        with ThreadPoolExecutor(2) as pool:
            one = pool.submit(record, rt, Entry(first.attempt, first.batch_id, done(1)), writer.write)
            assert first_releasing.wait(30)
            two = pool.submit(record, rt, Entry(second.attempt, second.batch_id, done(1)), writer.write)
            assert one.result(30) and two.result(30)
    finally:
        writer.close()
    ids = first.item_id, second.item_id
    assert order == [("commit", ids[0]), ("release", ids[0]), ("commit", ids[1]), ("release", ids[1])]
    assert rt.queue.inflight(NODE) == 0


def test_the_write_puts_every_column_of_the_outcome_on_the_item_row(rt, make_batch):
    """The write runs on the driver's cursor with its values bound by position (SQLite) or by name (PostgreSQL):
    each column of the item row holds its own value, and the counters their sums."""
    batch = make_batch(2)
    ok, failed = rt.queue.claim(NODE, 2, 30, ["m"])
    usage = Usage(input_tokens=11, cached_tokens=3, output_tokens=22, reasoning_tokens=5)
    written = result.commit_and_release(
        rt,
        [
            Entry(ok.attempt, batch, Outcome(ItemStatus.completed, 200, "req-1", '{"a": 1}', usage=usage)),
            Entry(failed.attempt, batch, Outcome(ItemStatus.failed, error_code="x", error_message="y")),
        ],
    )
    assert written == [True, True]
    with rt.store.read() as s:
        a, b = s.get(Item, ok.item_id), s.get(Item, failed.item_id)
        assert (a.status, a.attempts, a.response_status, a.request_id, a.response_body) == (
            "completed",
            1,
            200,
            "req-1",
            '{"a": 1}',
        )
        assert (a.error_code, a.error_message, a.finished_at is not None) == (None, None, True)
        assert (a.input_tokens, a.cached_tokens, a.output_tokens, a.reasoning_tokens) == (11, 3, 22, 5)
        assert (b.status, b.response_status, b.error_code, b.error_message, b.input_tokens) == (
            "failed",
            None,
            "x",
            "y",
            0,
        )
    row = batch_row(rt, batch)
    assert (
        row.completed,
        row.failed,
        row.input_tokens,
        row.cached_tokens,
        row.output_tokens,
        row.reasoning_tokens,
    ) == (
        1,
        1,
        11,
        3,
        22,
        5,
    )
    assert rt.queue.inflight(NODE) == 0


def test_a_driver_transaction_that_fails_writes_nothing_and_gives_its_connection_back(rt, make_batch):
    batch = make_batch(1)
    (claim,) = rt.queue.claim(NODE, 1, 30, ["m"])
    add = rt.store.driver(result._ADD_TO_BATCH)
    counters = {f"add_{c}": 1 for c in result._COUNTERS}
    with pytest.raises(RuntimeError, match="after the UPDATE"), rt.store.driver_transaction() as cursor:
        assert add.run(cursor, {"batch_id": batch, **counters}).fetchone()[2] == 1  # completed, in the transaction
        raise RuntimeError("after the UPDATE")
    assert batch_row(rt, batch).completed == 0  # rolled back
    assert rt.store.engine.pool.checkedout() == 0
    assert result.commit_and_release(rt, [Entry(claim.attempt, batch, done(1))]) == [True]  # the store still writes
    assert batch_row(rt, batch).completed == 1
