"""Whether this node's engine is up, as its worker process sees it: the lease state machine's engine-down path.

A task whose request fails asks :meth:`EngineHealth.outage` (``policy.outage``: a refused connection is an outage;
a broken connection, a timeout or a 5xx is one only if ``/health`` fails too). On an outage the engine is marked
down: one log line, the ``tidal_engine_up`` gauge to 0, the LeaseBook paused (no engine token is granted, so every
prefetched task and every task in a retry backoff hands its item back at once, no retry spent), and the claims whose
task has not started handed back now. The claim loop claims nothing meanwhile, the floor included, and probes
``/health`` every ``engine_probe_seconds``; the first 200 marks the engine up, and the book and the claim loop
resume. So an outage of any length costs no retry and no error line, and other nodes keep draining the batch.
"""

from __future__ import annotations

import logging
import threading
import time

import prometheus_client

from tidal_workers.handback import give_back_unstarted
from tidal_workers.health import engine_answers
from tidal_workers.leases import ENGINE_DOWN
from tidal_workers.leases import LeaseBook
from tidal_workers.policy.outage import Failure
from tidal_workers.policy.outage import is_outage
from tidal_workers.policy.outage import needs_probe
from tidal_workers.runtime import Runtime

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

    def __init__(self, rt: Runtime, book: LeaseBook):
        self.rt, self.book = rt, book
        self._lock = threading.Lock()
        self._down = False
        self._down_since = 0.0
        self._next_probe = 0.0

    @property
    def up(self) -> bool:
        return not self._down

    def healthy(self) -> bool:
        """One probe of the engine's /health (200 within a couple of seconds)."""
        return engine_answers(self.rt.settings).ok

    def outage(self, failure: Failure, why: str) -> bool:
        """Whether this failed request is an engine outage (probing /health where the policy asks); marks it so."""
        health_ok = self.healthy() if needs_probe(failure) else None
        if not is_outage(failure, health_ok):
            return False
        self.mark_down(f"{failure.value}: {why}"[:200])
        return True

    def mark_down(self, why: str) -> None:
        with self._lock:
            if self._down:
                return
            self._down = True
            self._down_since = time.monotonic()
            self._next_probe = 0.0
        self.book.pause(ENGINE_DOWN)
        ENGINE_UP.set(0)
        OUTAGES.inc()
        log.warning("engine %s is down (%s): claiming stops, its items go back to the queue", self.url, why)
        HANDED_BACK.inc(give_back_unstarted(self.rt, self.book))

    def mark_up(self) -> None:
        with self._lock:
            if not self._down:
                return
            self._down = False
            lasted = time.monotonic() - self._down_since
        self.book.resume(ENGINE_DOWN)
        ENGINE_UP.set(1)
        log.warning("engine %s is up again after %.0f s: claiming resumes", self.url, lasted)

    def may_claim(self, now: float) -> bool:
        """The claim loop's question each pass: up, or found up by a probe now (at most one per probe period)."""
        if self.up:
            return True
        if now < self._next_probe:
            return False
        self._next_probe = now + self.rt.settings.engine_probe_seconds
        if self.healthy():
            self.mark_up()
        return self.up

    @property
    def url(self) -> str:
        return self.rt.settings.vllm_url
