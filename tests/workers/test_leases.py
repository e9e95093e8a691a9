"""The LeaseBook's engine tokens: the gate's target bounds requests at the engine, waiters are served in order, a
paused book grants none."""

from __future__ import annotations

import threading
import time

from tests.support.wait import wait_for
from tidal_workers.attempt import Attempt
from tidal_workers.leases import LeaseBook
from tidal_workers.leases import Pause
from tidal_workers.leases import State


def book_of(n: int, target: int) -> LeaseBook:
    book = LeaseBook()
    for i in range(n):
        book.add(Attempt(i, f"n|1|{i}"))
    book.set_target(target)
    return book


def test_the_target_bounds_requests_at_the_engine_not_leases():
    book = book_of(3, target=2)
    assert book.take_token(Attempt(0, "n|1|0"), 1)[0] and book.take_token(Attempt(1, "n|1|1"), 1)[0]
    assert book.outstanding() == 2 and len(book) == 3
    assert book.take_token(Attempt(2, "n|1|2"), 0.05) == (False, None)  # no token: the target is spent
    book.answered(Attempt(0, "n|1|0"))
    got, freed_at = book.take_token(Attempt(2, "n|1|2"), 1)
    assert got and freed_at is not None  # the token an answered request freed, stamped when it was
    assert book.outstanding() == 2


def test_waiters_take_tokens_in_the_order_they_asked():
    book = book_of(3, target=1)
    assert book.take_token(Attempt(0, "n|1|0"), 1)[0]
    order: list[int] = []

    def wait(i: int) -> None:
        if book.take_token(Attempt(i, f"n|1|{i}"), 30)[0]:
            order.append(i)
            book.answered(Attempt(i, f"n|1|{i}"))

    first = threading.Thread(target=wait, args=(1,))
    first.start()
    wait_for(lambda: book._waiting and book._waiting[0] == 1, 10, what="the first waiter")
    second = threading.Thread(target=wait, args=(2,))
    second.start()
    wait_for(lambda: len(book._waiting) == 2, 10, what="the second waiter")
    book.answered(Attempt(0, "n|1|0"))
    first.join(10)
    second.join(10)
    assert order == [1, 2]


def test_a_floor_item_passes_the_target_and_counts_in_o():
    book = LeaseBook()
    book.add(Attempt(7, "n|1|7"), floor=True)
    assert book.take_token(Attempt(7, "n|1|7"), 0.05)[0] and book.outstanding() == 1  # target 0: the gate is closed


def test_a_returned_token_goes_to_the_next_waiter_with_its_stamp():
    book = book_of(2, target=1)
    book.take_token(Attempt(0, "n|1|0"), 1)
    book.answered(Attempt(0, "n|1|0"))
    got = book.take_token(Attempt(1, "n|1|1"), 1)
    assert got[0] and got[1] is not None
    book.return_token(Attempt(1, "n|1|1"), got[1])  # a re-check failed: no POST
    assert book.outstanding() == 0
    assert book.take_token(Attempt(1, "n|1|1"), 1) == got


def test_a_lost_lease_at_the_engine_stays_in_o_until_it_is_answered():
    book = book_of(2, target=2)
    book.take_token(Attempt(0, "n|1|0"), 1)
    book.forget([0, 1])
    assert book.outstanding() == 1 and book.attempts() == [(0, "n|1|0")]
    book.answered(Attempt(0, "n|1|0"))
    book.discard(Attempt(0, "n|1|0"))
    assert book.outstanding() == 0 and len(book) == 0


def test_unstarted_claims_are_taken_out_once_old():
    book = book_of(2, target=1)
    assert book.start(Attempt(0, "n|1|0"))
    assert book.take_unstarted(0.0) == [(1, "n|1|1")]
    assert not book.start(Attempt(1, "n|1|1"))  # its task starts late and finds itself gone
    assert [h.state for h in book._held.values()] == [State.PREFETCHED]


def test_a_paused_book_grants_no_token_until_every_reason_is_gone():
    """Engine down or worker stopping: a waiter wakes at once with no token, a floor item gets none either, and the
    book grants tokens again only once neither reason holds."""
    book = book_of(3, target=1)
    book.add(Attempt(9, "n|1|9"), floor=True)
    woke: list = []
    waiter = threading.Thread(target=lambda: woke.append(book.take_token(Attempt(0, "n|1|0"), 60)))
    book.set_target(0)  # the waiter waits: no token to take
    waiter.start()
    wait_for(lambda: 0 in book._waiting, 10, what="the waiter")
    book.set_target(1)
    book.pause(Pause.ENGINE_DOWN)
    waiter.join(10)
    assert woke == [(False, None)] and book.paused.is_set()  # woken, not after its 60 s
    assert book.take_token(Attempt(9, "n|1|9"), 0.05) == (False, None)  # the floor passes the target, not a pause
    book.pause(Pause.STOPPING)
    book.resume(Pause.ENGINE_DOWN)
    assert book.paused.is_set() and book.take_token(Attempt(1, "n|1|1"), 0.05) == (False, None)
    book.resume(Pause.STOPPING)
    assert not book.paused.is_set() and book.take_token(Attempt(1, "n|1|1"), 1)[0]


def test_a_lease_is_trusted_until_its_stamp_and_renewal_moves_the_stamp():
    """No stamp, no trust (every re-check asks Redis); a renewal extends it; a lease lost while at the engine is no
    longer trusted, so its result's re-check asks Redis and drops it."""
    book = book_of(2, target=2)
    assert not book.current(Attempt(0, "n|1|0"))
    book.renewed([Attempt(0, "n|1|0"), Attempt(1, "n|1|1")], time.monotonic() + 60)
    assert book.current(Attempt(0, "n|1|0")) and book.current(Attempt(1, "n|1|1"))
    assert not book.current(Attempt(0, "n|2|0"))  # another attempt's lease
    book.take_token(Attempt(0, "n|1|0"), 1)
    book.forget([0, 1])  # the renewal found both lost: the sent one stays in the book, untrusted
    assert not book.current(Attempt(0, "n|1|0")) and not book.current(Attempt(1, "n|1|1"))
    book.add(Attempt(5, "n|1|5"), trusted_until=time.monotonic() - 1)
    assert not book.current(Attempt(5, "n|1|5"))  # its half lease has passed
