"""What one worker process holds: its Runtime and the book of leases it must keep renewing.

Built by ``ContextStep`` when the worker starts (one per process, never a global
shared with the API) and reached by tasks through ``worker_context(app)``.
Workers run the threads pool, so the claim thread and the tasks share it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import typing as t

from celery import Celery
from celery import bootsteps
from celery.worker import WorkController

from tidal_workers.blobs.sentinel import prepare_storage
from tidal_workers.engine_health import EngineHealth
from tidal_workers.health import Check
from tidal_workers.health import dependency_checks
from tidal_workers.health import engine_answers
from tidal_workers.runtime import Runtime


class LeaseBook:
    """item_id -> lease of every item this process claimed and has not settled (thread-safe).

    A lease is renewed only once its task has started (``start``): a task that never starts (revoked from Flower,
    a lost message) lets its lease run out, and its item goes back to the queue within ``lease_seconds`` of the
    claim. Until then the claim's own lease covers the wait in the node's queue; a lease not started by then is
    dropped from the book (``renewable``).
    """

    def __init__(self) -> None:
        self._leases: dict[int, str] = {}
        self._booked: dict[int, float] = {}  # item_id -> monotonic time of the claim, until its task starts
        self._lock = threading.Lock()
        # Set when a task gives its lease up: there may be room under the gate's target again, and the
        # claim loop waits on this rather than sleeping out its idle period while the engine runs short.
        self.released = threading.Event()

    def add(self, item_id: int, lease: str) -> None:
        with self._lock:
            self._leases[item_id] = lease
            self._booked[item_id] = time.monotonic()

    def start(self, item_id: int, lease: str) -> bool:
        """The task of ``lease`` has started: renew it from now on. False if the book no longer holds it."""
        with self._lock:
            if self._leases.get(item_id) != lease:
                return False
            self._booked.pop(item_id, None)
            return True

    def discard(self, item_id: int, lease: str) -> None:
        with self._lock:
            if self._leases.get(item_id) == lease:
                del self._leases[item_id]
                self._booked.pop(item_id, None)
                self.released.set()

    def forget(self, item_ids: list[int]) -> None:
        with self._lock:
            for item_id in item_ids:
                self._leases.pop(item_id, None)
                self._booked.pop(item_id, None)

    def renewable(self, lease_seconds: float) -> list[tuple[int, str]]:
        """The leases whose task has started; those not started within ``lease_seconds`` of their claim are dropped
        (their lease has run out in Redis, and a task starting now would find it stale)."""
        now = time.monotonic()
        with self._lock:
            for item_id in [i for i, at in self._booked.items() if now - at >= lease_seconds]:
                del self._leases[item_id], self._booked[item_id]
            return [(i, lease) for i, lease in self._leases.items() if i not in self._booked]

    def items(self) -> list[tuple[int, str]]:
        with self._lock:
            return list(self._leases.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)


@dataclasses.dataclass
class WorkerContext:
    rt: Runtime
    leases: LeaseBook
    # The engine preflight's verdict, which /ready reports. Until a preflight replaces it with its own last
    # result, the co-located engine's /health answering stands in for it.
    preflight: t.Callable[[], Check] | None = None
    engine: EngineHealth = dataclasses.field(init=False)  # up or down, as the tasks and the claim loop see it

    def __post_init__(self) -> None:
        self.engine = EngineHealth(self.rt.settings)

    def ready_checks(self) -> list[Check]:
        """What the worker's /ready reports: its dependencies, then its engine preflight."""
        preflight = self.preflight() if self.preflight else engine_answers(self.rt.settings)
        return [*dependency_checks(self.rt), preflight]


class ContextStep(bootsteps.StartStopStep):
    """Builds the process's WorkerContext before the consumer (and ClaimStep) starts; closes it at exit."""

    def __init__(self, w: WorkController, **kwargs: t.Any):
        super().__init__(w, **kwargs)
        rt = Runtime(w.app.tidal_settings, celery=w.app)
        # Before anything starts: a worker that cannot see the API's files must not run at all.
        prepare_storage(rt, "worker")
        w.app.tidal_context = WorkerContext(rt, LeaseBook())

    def shutdown(self, w: WorkController) -> None:
        w.app.tidal_context.rt.close()


def worker_context(app: Celery) -> WorkerContext:
    try:
        context: WorkerContext = app.tidal_context
    except AttributeError:
        raise RuntimeError("Tidal tasks run only inside a worker of an app from make_celery()") from None
    return context
