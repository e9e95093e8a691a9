"""Giving claims back to the queue: the one path for every attempt this node holds and will not send.

A claim whose task never started within a lease (a revoked or lost message), a prefetched item that found no
engine token within its age, and everything not yet at the engine when the engine goes down or the worker stops.
``Queue.give_back`` puts the item back in its batch at its ordinal, for any node: the next claim of it is a new
attempt with its whole retry budget. An item whose batch was dropped meanwhile (cancelled, expired) is abandoned
instead, and the batch's finalization requested from the ops worker (never run here: the renewal thread and a
stopping consumer call this too). A split item's answered prefill goes back the same way, as its decode.
"""

from __future__ import annotations

from tidal_workers.attempt import Attempt
from tidal_workers.attempt import Ending
from tidal_workers.finalize import request_finalize
from tidal_workers.leases import LeaseBook
from tidal_workers.runtime import Runtime


def give_back(rt: Runtime, attempt: Attempt, as_phase: str = "") -> Ending:
    """Requeue one claim if its lease is still current: GIVEN_BACK, ABANDONED (batch dropped) or STALE.
    ``as_phase``: the phase it is queued as from now on (``Queue.give_back``)."""
    given = rt.queue.give_back(attempt, as_phase)
    if given is None:
        return Ending.STALE
    if not given.requeued and given.batch_id:
        request_finalize(rt, given.batch_id)
    return Ending.GIVEN_BACK if given.requeued else Ending.ABANDONED


def give_back_unstarted(rt: Runtime, book: LeaseBook, older_than: float = 0.0) -> int:
    """Take the claims whose task has not started for ``older_than`` seconds out of ``book`` and give them back;
    returns how many went back to the queue."""
    return sum(give_back(rt, attempt) is Ending.GIVEN_BACK for attempt in book.take_unstarted(older_than))
