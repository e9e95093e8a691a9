"""The node's lease book: every attempt this process claimed, in its state of the lease state machine.

claimed → prefetched → sent → answered → released (docs/architecture.md, "The lease state machine"). The
claim thread books claims and keeps the book at most the gate's target plus a small prefetch; each
``tidal.run_item`` task waits here for an *engine token* (one of the gate's target) before it POSTs, and frees
it as soon as the POST returns, so the target bounds the node's batch requests at the engine (O), not its
leases. The renewal thread renews what the book holds. While the book is paused (its engine is down or fails its
preflight, or the worker is stopping) it grants no token: a waiting task wakes and hands its item back. One lock guards it all;
nothing under it does I/O.

The book also knows until when each lease is surely still this node's (``trusted_until``): half a lease after the
claim or renewal that last set its expiry was sent. Only its expiry, or this node, takes a lease away (a cancel
leaves leased items to finish), so until then the re-checks before a POST and before a result write need not
ask Redis; past it (renewal stalled, a process paused), they do.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import threading
import time

import prometheus_client

from tidal_workers.attempt import Attempt


class State(enum.StrEnum):
    """Where a held attempt is in the lease state machine (released: no longer in the book)."""

    CLAIMED = "claimed"  # booked by the claim thread; its task has not started
    PREFETCHED = "prefetched"  # its task runs and waits for an engine token
    SENT = "sent"  # its POST is at the engine (counted in O)
    ANSWERED = "answered"  # its POST returned; its result is being recorded


class Pause(enum.StrEnum):
    """Why the book grants no engine token."""

    ENGINE_DOWN = "engine down"
    PREFLIGHT = "preflight failing"
    STOPPING = "stopping"


HELD = prometheus_client.Gauge(
    "tidal_gate_inflight",
    "Batch items this node holds leases on: claimed, waiting for an engine token, at the engine, or being recorded.",
)
ENGINE_OUTSTANDING = prometheus_client.Gauge(
    "tidal_gate_engine_outstanding",
    "Batch requests this node has at the engine (POSTs sent and not yet answered): the gate's O.",
)


def trusted_until(asked: float, lease_seconds: float) -> float:
    """Until when a lease whose expiry a Redis call sent at ``asked`` (time.monotonic()) set ``lease_seconds`` ahead
    is surely current: half the lease is the margin for the two clocks and a slow reply."""
    return asked + lease_seconds / 2


@dataclasses.dataclass
class Held:
    lease: str
    state: State
    since: float  # time.monotonic() when it entered ``state``
    floor: bool  # admitted by the SLA floor: it may take a token past the target
    trusted_until: float  # time.monotonic() until which the lease is surely current without asking Redis


class LeaseBook:
    """item_id -> the attempt this process holds, and the engine tokens (thread-safe)."""

    def __init__(self) -> None:
        self._held: dict[int, Held] = {}
        self._cond = threading.Condition()
        self._waiting: collections.deque[int] = collections.deque()  # prefetched items, in the order they asked
        self._freed: collections.deque[float] = collections.deque()  # when tokens were freed and not yet taken
        self._outstanding = 0
        self.target = 0  # engine tokens: the gate's target, set by the claim loop
        # Set when an attempt is released: there may be room under target + prefetch again, and the claim loop
        # waits on this rather than sleeping out its idle period while the engine runs short.
        self.released = threading.Event()
        # Set while the book grants no token (for any of ``_pauses``); a task sleeping out a retry backoff waits on
        # it, so an outage or a shutdown ends the wait at once and the task hands its item back.
        self.paused = threading.Event()
        self._pauses: set[Pause] = set()
        ENGINE_OUTSTANDING.set(0)
        HELD.set(0)

    # --- the claim thread ------------------------------------------------------
    def add(self, attempt: Attempt, floor: bool = False, trusted_until: float = 0.0) -> None:
        """claimed: booked before its message is published (a task may start before send() returns).
        ``trusted_until``: see ``current``; by default never (every re-check asks Redis)."""
        with self._cond:
            self._held[attempt.item_id] = Held(attempt.lease, State.CLAIMED, time.monotonic(), floor, trusted_until)
            HELD.set(len(self._held))

    def floor_held(self) -> int:
        """Attempts the SLA floor admitted that this node still holds (the floor's cap counts these)."""
        with self._cond:
            return sum(held.floor for held in self._held.values())

    def set_target(self, target: int) -> None:
        with self._cond:
            if target != self.target:
                self.target = target
                self._cond.notify_all()

    def pause(self, why: Pause) -> None:
        """Grant no token while ``why`` holds; the tasks waiting for one wake at once."""
        with self._cond:
            self._pauses.add(why)
            self.paused.set()
            self._cond.notify_all()

    def resume(self, why: Pause) -> None:
        """``why`` no longer holds; tokens are granted again once no other reason does."""
        with self._cond:
            self._pauses.discard(why)
            if not self._pauses:
                self.paused.clear()
                self._cond.notify_all()

    # --- the task ----------------------------------------------------------------
    def start(self, attempt: Attempt) -> bool:
        """claimed → prefetched: the task runs; False if the book no longer holds this attempt (given back)."""
        with self._cond:
            held = self._mine(attempt)
            if held is not None and held.state is State.CLAIMED:
                held.state, held.since = State.PREFETCHED, time.monotonic()
            return held is not None

    def take_token(self, attempt: Attempt, timeout: float) -> tuple[bool, float | None]:
        """prefetched → sent once a token is free and every earlier waiter has one; (False, None) on timeout, or at
        once while the book is paused.

        Returns with the token the time it was freed, if it was one an answered request gave back (the start of
        the "token freed → next POST sent" interval), else None (a token the gate added).
        """
        deadline = time.monotonic() + timeout
        item_id = attempt.item_id
        with self._cond:
            held = self._mine(attempt)
            if held is None:
                return False, None
            held.state, held.since = State.PREFETCHED, time.monotonic()
            self._waiting.append(item_id)
            try:
                while True:
                    held = self._mine(attempt)
                    if held is None or self._pauses:  # lease lost or given back; the engine down or stopping
                        return False, None
                    first = self._waiting[0] == item_id
                    if held.floor or (first and self._outstanding < self.target):
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False, None
                    self._cond.wait(left)
            finally:
                self._waiting.remove(item_id)
                self._cond.notify_all()  # the next waiter may now be first
            held.state, held.since = State.SENT, time.monotonic()
            self._set_outstanding(self._outstanding + 1)
            return True, self._freed.popleft() if self._freed else None

    def return_token(self, attempt: Attempt, freed_at: float | None) -> None:
        """sent → prefetched without a POST (a re-check failed): the token goes to the next waiter unused."""
        with self._cond:
            self._free_token(attempt, State.PREFETCHED)
            if freed_at is not None:
                self._freed.appendleft(freed_at)

    def answered(self, attempt: Attempt) -> None:
        """sent → answered: the POST returned, so its token is free for the next prefetched attempt."""
        with self._cond:
            if self._free_token(attempt, State.ANSWERED):
                self._freed.append(time.monotonic())
                del_old = len(self._freed) - max(self.target, 1)
                for _ in range(max(0, del_old)):  # stamps of tokens nobody waited for are not dispatch delay
                    self._freed.popleft()

    def discard(self, attempt: Attempt) -> None:
        """→ released (from any state): the attempt is over on this node."""
        with self._cond:
            held = self._mine(attempt)
            if held is None:
                return
            if held.state is State.SENT:  # defensive: a sent attempt is answered first
                self._set_outstanding(self._outstanding - 1)
            del self._held[attempt.item_id]
            HELD.set(len(self._held))
            self._cond.notify_all()
        self.released.set()

    # --- the renewal thread --------------------------------------------------------
    def renewed(self, attempts: list[Attempt], trusted_until: float) -> None:
        """These attempts' leases were just extended in Redis: each is surely current until ``trusted_until``."""
        with self._cond:
            for attempt in attempts:
                held = self._mine(attempt)
                if held is not None:
                    held.trusted_until = max(held.trusted_until, trusted_until)

    def forget(self, item_ids: list[int]) -> None:
        """Leases Redis no longer holds for us: a waiting attempt wakes and finds itself gone.

        A sent one stays until its POST returns (it is still at the engine, so still in O); its result is dropped.
        """
        with self._cond:
            for item_id in item_ids:
                held = self._held.get(item_id)
                if held is not None and held.state is State.SENT:
                    held.trusted_until = 0.0  # the re-check before its result is written asks Redis, and fails
                elif held is not None:
                    del self._held[item_id]
            HELD.set(len(self._held))
            self._cond.notify_all()
        self.released.set()

    def take_unstarted(self, older_than: float = 0.0) -> list[Attempt]:
        """Remove and return claims whose task has not started for ``older_than`` seconds (a revoked or lost
        message; with 0, every one, as the engine goes down or the worker stops): the caller gives them back, and
        a task that starts later finds itself gone."""
        cutoff = time.monotonic() - older_than
        with self._cond:
            old = [Attempt(i, h.lease) for i, h in self._held.items() if h.state is State.CLAIMED and h.since <= cutoff]
            for attempt in old:
                del self._held[attempt.item_id]
            HELD.set(len(self._held))
        return old

    # --- reading -------------------------------------------------------------------
    def attempts(self) -> list[Attempt]:
        with self._cond:
            return [Attempt(i, h.lease) for i, h in self._held.items()]

    def current(self, attempt: Attempt) -> bool:
        """True if the book holds this attempt and a claim or renewal showed its lease current lately enough that
        it cannot have expired since; False means "ask Redis", not "stale"."""
        with self._cond:
            held = self._mine(attempt)
            return held is not None and time.monotonic() < held.trusted_until

    def outstanding(self) -> int:
        """O: this node's batch requests at the engine."""
        with self._cond:
            return self._outstanding

    def __len__(self) -> int:
        with self._cond:
            return len(self._held)

    # --- under the lock ----------------------------------------------------------------
    def _mine(self, attempt: Attempt) -> Held | None:
        held = self._held.get(attempt.item_id)
        return held if held is not None and held.lease == attempt.lease else None

    def _free_token(self, attempt: Attempt, to: State) -> bool:
        held = self._mine(attempt)
        if held is None or held.state is not State.SENT:
            return False
        held.state, held.since = to, time.monotonic()
        self._set_outstanding(self._outstanding - 1)
        self._cond.notify_all()
        return True

    def _set_outstanding(self, n: int) -> None:
        self._outstanding = n
        ENGINE_OUTSTANDING.set(n)
