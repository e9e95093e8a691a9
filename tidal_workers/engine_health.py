"""Whether this node's engine is up, as its worker process sees it.

The engine is taken as down when a request to it is refused, or when a request fails and its ``/health`` fails
too (``policy.outage``); the tasks mark it. While it is down the claim loop claims nothing (the floor included) and
probes ``/health`` every ``engine_probe_seconds``; the first 200 marks it up and claiming resumes. Each change is
one log line and moves the ``tidal_engine_up`` gauge. Tasks hand their items back while it is down
(``Queue.give_back``), so an outage of any length costs no retry and no error line. A worker
that is shutting down holds its sends the same way (``stopping``): what it has not sent goes back at once.
"""

from __future__ import annotations

import logging
import threading
import time

import prometheus_client

from config import Settings
from tidal_workers.health import engine_answers

log = logging.getLogger(__name__)

ENGINE_UP = prometheus_client.Gauge(
    "tidal_engine_up", "1 while this node's engine is taken as up; 0 while it is down and the node claims nothing."
)
OUTAGES = prometheus_client.Counter("tidal_engine_outages", "Times this node's engine was found down.")
HANDED_BACK = prometheus_client.Counter(
    "tidal_engine_outage_handed_back_items",
    "Items handed back to the queue, no retry used, because the engine was down.",
)
ENGINE_UP.set(1)


class EngineHealth:
    """Up or down, shared by the claim loop and the tasks of one worker process (thread-safe)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._lock = threading.Lock()
        self._down = False
        self._stopping = False
        # Set while nothing may be sent: the engine is down, or the worker is stopping. A task sleeping out a retry
        # backoff waits on it, so it wakes at once and hands its item back.
        self.hold = threading.Event()
        self._down_since = 0.0
        self._next_probe = 0.0

    @property
    def up(self) -> bool:
        return not self._down

    def may_send(self) -> bool:
        return not self.hold.is_set()

    def stopping(self) -> None:
        """The worker is shutting down: items not yet sent go back to the queue; requests under way finish."""
        with self._lock:
            self._stopping = True
            self.hold.set()
        log.info("worker stopping: items not yet sent go back to the queue")

    def healthy(self) -> bool:
        """One probe of the engine's /health (200 within a couple of seconds)."""
        return engine_answers(self.settings).ok

    def mark_down(self, why: str) -> None:
        with self._lock:
            if self._down:
                return
            self._down = True
            self.hold.set()
            self._down_since = time.monotonic()
            self._next_probe = 0.0
        ENGINE_UP.set(0)
        OUTAGES.inc()
        log.warning("engine %s is down (%s): claiming stops, its items go back to the queue", self.url, why)

    def mark_up(self) -> None:
        with self._lock:
            if not self._down:
                return
            self._down = False
            if not self._stopping:
                self.hold.clear()
            lasted = time.monotonic() - self._down_since
        ENGINE_UP.set(1)
        log.warning("engine %s is up again after %.0f s: claiming resumes", self.url, lasted)

    def may_claim(self, now: float) -> bool:
        """The claim loop's question each pass: up, or found up by a probe now (at most one per probe period); never
        while the worker is stopping (a claim then would sit unsent until its lease ran out)."""
        if self._stopping:
            return False
        if self.up:
            return True
        if now < self._next_probe:
            return False
        self._next_probe = now + self.settings.engine_probe_seconds
        if self.healthy():
            self.mark_up()
        return self.up

    @property
    def url(self) -> str:
        return self.settings.vllm_url
