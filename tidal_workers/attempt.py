"""One attempt at an item: the item and the lease it runs under, as one value, and the ways an attempt ends.

Every claim of an item is a new attempt with a lease of its own, ``node|attempt|claim-µs``: the node that claimed
it, the attempt's number (the item's ``attempts`` once written) and when. The lease fences the attempt: only the
holder of the item's current lease may send it, write its result or give it back, so an ``Attempt`` travels as a
whole from the claim to the release (docs/architecture.md, "The lease state machine"). The Celery message of
``tidal.run_item`` carries its two fields as two arguments, a format kept across versions.
"""

from __future__ import annotations

import enum
import typing as t


def parse_lease(lease: str) -> tuple[str, int]:
    """(node, attempt number) of a lease ``node|attempt|claim-µs``."""
    node, number, _stamp = lease.rsplit("|", 2)
    return node, int(number)


class Attempt(t.NamedTuple):
    """An item and the lease this attempt holds on it (a tuple, so a group of them goes to Redis as it is)."""

    item_id: int
    lease: str

    @property
    def node(self) -> str:
        return parse_lease(self.lease)[0]

    @property
    def number(self) -> int:
        """1 for an item's first attempt, then one more for each claim of it."""
        return parse_lease(self.lease)[1]

    @property
    def task_id(self) -> str:
        """The Celery task id Flower shows for this attempt."""
        return f"item-{self.item_id}#{self.number}"


class Ending(enum.StrEnum):
    """How one ``tidal.run_item`` attempt ended (its task's result, in Flower)."""

    COMPLETED = "completed"  # the engine's answer written as the item's response line
    FAILED = "failed"  # an error line written (the request's own fault, or its retries spent)
    PREFILLED = "prefilled"  # a split item's prefill answered: queued again as its decode, nothing written
    GIVEN_BACK = "given_back"  # back in the queue unsent (no engine token in time, engine down, stopping)
    ABANDONED = "abandoned"  # its batch was cancelled or expired before it was sent
    STALE = "stale"  # its lease was no longer current: another attempt owns the item
    DONE = "done"  # the item was already settled by an earlier attempt
    DROPPED = "dropped"  # answered, but the write found the lease gone or another attempt's result first


__all__ = ["Attempt", "Ending", "parse_lease"]
