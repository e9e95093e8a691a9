"""Whether this node's engine is up, as its worker process sees it.

The engine is taken as down when a request to it is refused, or when a request fails and its ``/health`` fails
too (``policy.outage``); the tasks mark it. While it is down the claim loop claims nothing (the floor included) and
probes ``/health`` every ``engine_probe_seconds``; the first 200 marks it up and claiming resumes. Each change is
one log line and moves the ``tidal_engine_up`` gauge. Tasks hand their items back while it is down
(:func:`tidal_workers.sweeps.give_back`), so an outage of any length costs no retry and no error line.
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
        self.down = threading.Event()  # set while down: a task sleeping out a retry backoff wakes at once
        self._down_since = 0.0
        self._next_probe = 0.0

    @property
    def up(self) -> bool:
        return not self.down.is_set()

    def healthy(self) -> bool:
        """One probe of the engine's /health (200 within a couple of seconds)."""
        return engine_answers(self.settings).ok

    def mark_down(self, why: str) -> None:
        with self._lock:
            if self.down.is_set():
                return
            self.down.set()
            self._down_since = time.monotonic()
            self._next_probe = 0.0
        ENGINE_UP.set(0)
        OUTAGES.inc()
        log.warning("engine %s is down (%s): claiming stops, its items go back to the queue", self.url, why)

    def mark_up(self) -> None:
        with self._lock:
            if not self.down.is_set():
                return
            self.down.clear()
            lasted = time.monotonic() - self._down_since
        ENGINE_UP.set(1)
        log.warning("engine %s is up again after %.0f s: claiming resumes", self.url, lasted)

    def may_claim(self, now: float) -> bool:
        """The claim loop's question each pass: up, or found up by a probe now (at most one per probe period)."""
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
