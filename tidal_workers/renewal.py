"""The renewal thread: keeps this node's leases alive, on a thread of its own.

Every ``lease_seconds / 3`` it renews every attempt the LeaseBook holds (a slow
claim pass, scrape or result write can never let them lapse and the engine's
work be redone), forgets the ones Redis no longer holds for us, gives back
claims whose task has not started within a lease (a revoked or lost message), reclaims expired
leases of dead nodes (``reclaim.py``: requeued, or written off at the reclaim limit; their batches'
finalization goes to the ops worker), re-reads the models the engine serves (``served.py``: one GET kept
off the claim thread) and rebuilds the queue from SQL at start and after Redis
lost its data.
"""

from __future__ import annotations

import logging
import threading
import time
import typing as t

from tidal_workers.context import WorkerContext
from tidal_workers.enqueue import rebuild
from tidal_workers.handback import give_back_unstarted
from tidal_workers.leases import trusted_until
from tidal_workers.reclaim import reclaim

log = logging.getLogger(__name__)


class Renewal:
    def __init__(self, ctx: WorkerContext):
        self.rt, self.leases, self.served = ctx.rt, ctx.leases, ctx.served
        self.settings = ctx.rt.settings
        self._built = False

    def once(self) -> None:
        s, q = self.settings, self.rt.queue
        held, asked = self.leases.attempts(), time.monotonic()
        lost = q.renew(s.node, held, s.lease_seconds)
        self.leases.forget(lost)
        gone = set(lost)
        self.leases.renewed([a for a in held if a.item_id not in gone], trusted_until(asked, s.lease_seconds))
        give_back_unstarted(self.rt, self.leases, s.lease_seconds)
        self.served.refresh()
        reclaim(self.rt)
        if not self._built or not q.is_built():
            if self._built:
                log.warning("the Redis queue is gone: rebuilding it from SQL")
            rebuild(self.rt)
            self._built = True

    def runner(self, stopping: threading.Event) -> t.Callable[[], None]:
        def run() -> None:
            while not stopping.is_set():
                try:
                    self.once()
                except Exception:  # Redis or SQL blinked: keep the thread, try again next period
                    log.exception("lease renewal failed")
                stopping.wait(self.settings.lease_seconds / 3)

        return run
