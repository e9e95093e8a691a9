"""Whether this node's engine is up, as its worker process sees it: the lease state machine's engine-down path.

A task whose request fails asks :meth:`EngineHealth.outage` (``policy.outage``: a refused connection is an outage;
a broken connection, a timeout or a 5xx is one only if ``/health`` fails too). On an outage the engine is marked
down: one log line, the ``tidal_engine_up`` gauge to 0, the LeaseBook paused (no engine token is granted, so every
prefetched task and every task in a retry backoff hands its item back at once, no retry spent), and the claims whose
task has not started handed back now. The claim loop claims nothing meanwhile, the floor included, and probes
``/health`` every ``engine_probe_seconds``; the first 200 marks the engine up and resumes the book. An outage of
any length costs no retry and no error line, and other nodes keep draining the batch; a request at the engine each
time it died is counted (``poison.py``).

Claiming also waits for the engine's preflight (``preflight.py``), run by the claim loop at start and again once
the engine is back up. While it fails (the engine refuses ``priority``, lists no model) the book is paused, the
node claims nothing, says why in one log line and in ``/ready``, and exports ``tidal_preflight_ok`` 0; it probes
again every ``engine_probe_seconds`` and claims once it passes. A batch request the engine refuses for its
priority fails the preflight the same way, and its item goes back to the queue, no retry spent.
"""

from __future__ import annotations

import logging
import threading
import time

import prometheus_client

from tidal_workers.handback import give_back_unstarted
from tidal_workers.health import Check
from tidal_workers.health import engine_answers
from tidal_workers.leases import LeaseBook
from tidal_workers.leases import Pause
from tidal_workers.policy.outage import Failure
from tidal_workers.policy.outage import is_outage
from tidal_workers.policy.outage import needs_probe
from tidal_workers.preflight import probe
from tidal_workers.preflight import refusal
from tidal_workers.runtime import Runtime
from tidal_workers.served import ServedModels

log = logging.getLogger(__name__)

ENGINE_UP = prometheus_client.Gauge(
    "tidal_engine_up", "1 while this node's engine is taken as up; 0 while it is down and the node claims nothing."
)
OUTAGES = prometheus_client.Counter("tidal_engine_outages", "Times this node's engine was found down.")
HANDED_BACK = prometheus_client.Counter(
    "tidal_engine_outage_handed_back_items",
    "Items handed back to the queue, no retry used, because the engine was down.",
)
PREFLIGHT_OK = prometheus_client.Gauge(
    "tidal_preflight_ok",
    "1 while this node's engine passes its preflight (answers, lists a model, takes priority); 0 while it does not "
    "and the node claims nothing.",
)
ENGINE_UP.set(1)


class EngineHealth:
    """Up or down, shared by the claim loop and the tasks of one worker process (thread-safe)."""

    def __init__(self, rt: Runtime, book: LeaseBook, served: ServedModels | None = None):
        self.rt, self.book = rt, book
        self.served = served or ServedModels(rt)
        self._lock = threading.Lock()
        self._down = False
        self._down_since = 0.0
        self._next_probe = 0.0
        self._verdict: Check | None = None  # the last preflight's; None: none since start or the engine's return

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
            self._verdict = None  # the engine that comes back is checked again
        self.book.pause(Pause.ENGINE_DOWN)
        ENGINE_UP.set(0)
        PREFLIGHT_OK.set(0)
        OUTAGES.inc()
        log.warning("engine %s is down (%s): claiming stops, its items go back to the queue", self.url, why)
        HANDED_BACK.inc(give_back_unstarted(self.rt, self.book))

    def mark_up(self) -> None:
        with self._lock:
            if not self._down:
                return
            self._down = False
            lasted = time.monotonic() - self._down_since
        self.book.resume(Pause.ENGINE_DOWN)
        ENGINE_UP.set(1)
        log.warning("engine %s is up again after %.0f s", self.url, lasted)

    def may_claim(self, now: float) -> bool:
        """The claim loop's question each pass: up with its preflight passed, or found so by a probe now (at most
        one per probe period: ``/health`` while down, then the preflight)."""
        verdict = self._verdict
        if self.up and verdict is not None and verdict.ok:
            return True
        if now < self._next_probe:
            return False
        self._next_probe = now + self.rt.settings.engine_probe_seconds
        if not self.up:
            if not self.healthy():
                return False
            self.mark_up()
        return self.preflight()

    def preflight(self) -> bool:
        """Probe the engine (``preflight.probe``) with the models it lists now, and act on the verdict."""
        verdict = probe(self.rt.settings, self.served.refresh())
        self.judge(verdict)
        return verdict.ok

    def refused(self, answer: str) -> None:
        """A batch request met the engine's priority refusal (``answer``): the preflight fails until a probe passes
        again."""
        log.info("engine %s refused a batch request for its priority: %s", self.url, answer[:300])
        self.judge(refusal())

    def judge(self, verdict: Check) -> None:
        """Record a preflight verdict: a pass resumes the book; a failure pauses it and hands back what has not
        started. Logged once per change of verdict."""
        with self._lock:
            before, self._verdict = self._verdict, verdict
        PREFLIGHT_OK.set(1 if verdict.ok else 0)
        if verdict.ok:
            self.book.resume(Pause.PREFLIGHT)
            if before is not None and not before.ok:
                log.warning("engine %s passes its preflight: claiming resumes", self.url)
            return
        self.book.pause(Pause.PREFLIGHT)
        if before is None or before.ok or before.detail != verdict.detail:
            log.warning("engine %s fails its preflight, claiming nothing until it passes: %s", self.url, verdict.detail)
        give_back_unstarted(self.rt, self.book)

    def verdict(self) -> Check:
        """The preflight ``/ready`` reports: the last verdict while it fails, else whether the engine's ``/health``
        answers now (before the first preflight, and after one passed)."""
        verdict = self._verdict
        return verdict if verdict is not None and not verdict.ok else engine_answers(self.rt.settings)

    @property
    def url(self) -> str:
        return self.rt.settings.vllm_url
