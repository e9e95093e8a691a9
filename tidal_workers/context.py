"""What one worker process holds: its Runtime, the book of leases it must keep renewing, its engine's health and
the models that engine serves.

Built by ``ContextStep`` when the worker starts (one per process, never a global
shared with the API) and reached by tasks through ``worker_context(app)``.
Workers run the threads pool, so the claim thread and the tasks share it.
"""

from __future__ import annotations

import dataclasses
import typing as t

from celery import Celery
from celery import bootsteps
from celery.worker import WorkController

from tidal_workers.blobs.sentinel import prepare_storage
from tidal_workers.engine_health import EngineHealth
from tidal_workers.health import Check
from tidal_workers.health import dependency_checks
from tidal_workers.leases import LeaseBook
from tidal_workers.result import ResultWriter
from tidal_workers.runtime import Runtime
from tidal_workers.served import ServedModels


@dataclasses.dataclass
class WorkerContext:
    rt: Runtime
    leases: LeaseBook
    results: ResultWriter = dataclasses.field(init=False)
    engine: EngineHealth = dataclasses.field(init=False)  # up or down, as the tasks and the claim loop see it
    served: ServedModels = dataclasses.field(init=False)  # read by the renewal thread, used by the claim loop
    # The engine preflight's verdict, which /ready reports: the engine's own (``EngineHealth.verdict``).
    preflight: t.Callable[[], Check] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.results = ResultWriter(self.rt)
        self.served = ServedModels(self.rt)
        self.engine = EngineHealth(self.rt, self.leases, self.served)
        self.preflight = self.engine.verdict

    def ready_checks(self) -> list[Check]:
        """What the worker's /ready reports: its dependencies, then its engine preflight."""
        return [*dependency_checks(self.rt), self.preflight()]


class ContextStep(bootsteps.StartStopStep):
    """Builds the process's WorkerContext before the consumer (and ClaimStep) starts; closes it at exit."""

    def __init__(self, w: WorkController, **kwargs: t.Any):
        super().__init__(w, **kwargs)
        rt = Runtime(w.app.tidal_settings, celery=w.app)
        # Before anything starts: a worker that cannot see the API's files must not run at all.
        prepare_storage(rt.blobs, rt.redis, "worker", rt.settings.node)
        w.app.tidal_context = WorkerContext(rt, LeaseBook())

    def shutdown(self, w: WorkController) -> None:
        w.app.tidal_context.results.close()
        w.app.tidal_context.rt.close()


def worker_context(app: Celery) -> WorkerContext:
    try:
        context: WorkerContext = app.tidal_context
    except AttributeError:
        raise RuntimeError("Tidal tasks run only inside a worker of an app from make_celery()") from None
    return context
