"""The ``tidal.run_item`` task: POST one claimed item to the co-located vLLM, then record what came back.

Priority is read from the batch at each submission, so an escalation reaches
items not yet sent. A failed request is judged by ``policy.outage``: if the
engine is down (refused, or failing its ``/health``), the item goes back to the
queue at once with no retry spent and the node stops claiming until the engine
answers again (``engine_health``). Otherwise the failure (a timeout, a broken
connection, a 5xx, a 429) is the item's own: retried here with exponential
backoff while the claim thread keeps renewing the lease, and an error line once
``retry_budget`` is spent. A 4xx is the request's own fault: an error line with
the engine's status and body.
"""

from __future__ import annotations

import json
import logging
import typing as t

import requests
import urllib3.exceptions
from celery import Task
from celery import shared_task
from sqlalchemy import Row
from sqlalchemy import select

from tidal_workers import task_names
from tidal_workers.context import worker_context
from tidal_workers.engine_health import HANDED_BACK
from tidal_workers.engine_health import EngineHealth
from tidal_workers.finalize import maybe_finalize
from tidal_workers.policy.outage import Failure
from tidal_workers.policy.outage import is_outage
from tidal_workers.policy.outage import needs_probe
from tidal_workers.policy.pricing import Usage
from tidal_workers.result import Outcome
from tidal_workers.result import record
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus
from tidal_workers.sweeps import give_back

log = logging.getLogger(__name__)

BACKOFF_CAP_SECONDS = 30.0


class Transient(Exception):
    """The engine may answer next time; ``failure`` says how this request failed."""

    def __init__(self, failure: Failure, message: str):
        super().__init__(message)
        self.failure = failure


def _failure(exc: requests.RequestException) -> Failure:
    if isinstance(exc, requests.ConnectionError) and not isinstance(exc, requests.Timeout):
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        return Failure.REFUSED if isinstance(reason, urllib3.exceptions.NewConnectionError) else Failure.BROKEN
    return Failure.TIMEOUT if isinstance(exc, requests.Timeout) else Failure.BROKEN


def _load(rt: Runtime, item_id: int) -> Row[str, str, str, str] | None:
    with rt.store.read() as s:
        return s.execute(
            select(Item.batch_id, Item.url, Item.body, Item.status).where(Item.id == item_id)
        ).one_or_none()


def _batch_now(rt: Runtime, batch_id: str) -> Row[str, int]:
    """The batch's status and priority as of this submission (escalation and cancel reach queued items)."""
    with rt.store.read() as s:
        return s.execute(select(Batch.status, Batch.priority).where(Batch.id == batch_id)).one()


def submit(rt: Runtime, url: str, body: dict[str, t.Any], priority: int) -> Outcome:
    """One POST to the engine; raises Transient for anything worth retrying."""
    try:
        resp = requests.post(
            rt.settings.vllm_url.rstrip("/") + url,
            json={**body, "priority": priority},
            timeout=rt.settings.request_timeout_seconds,
        )
    except requests.RequestException as exc:
        raise Transient(_failure(exc), f"{type(exc).__name__}: {exc}") from exc
    if resp.status_code == 429 or resp.status_code >= 500:
        failure = Failure.BUSY if resp.status_code == 429 else Failure.SERVER_ERROR
        raise Transient(failure, f"engine answered {resp.status_code}: {resp.text[:200]}")
    try:
        payload = resp.json()
    except ValueError as exc:
        raise Transient(Failure.BROKEN, f"engine answered {resp.status_code} with a body that is not JSON") from exc
    request_id = resp.headers.get("x-request-id") or (payload.get("id") if isinstance(payload, dict) else None)
    ok = 200 <= resp.status_code < 300
    return Outcome(
        status=ItemStatus.completed if ok else ItemStatus.failed,
        response_status=resp.status_code,
        request_id=request_id,
        body=resp.text,
        usage=Usage.from_response(payload.get("usage")) if ok and isinstance(payload, dict) else Usage(),
    )


def engine_down(engine: EngineHealth, exc: Transient) -> bool:
    """Whether this failure is an engine outage (``policy.outage``, probing /health when it asks); marks it so."""
    health_ok = engine.healthy() if needs_probe(exc.failure) else None
    if not is_outage(exc.failure, health_ok):
        return False
    engine.mark_down(f"{exc.failure.value}: {exc}"[:200])
    return True


GIVEN_BACK = "given_back"  # execute_item's answer when the engine is down: run_item requeues the item


def execute_item(rt: Runtime, item_id: int, lease: str, engine: EngineHealth | None = None) -> str:
    """Run one claimed item to its outcome; returns what happened (for Flower and tests).

    ``GIVEN_BACK``: the engine is down (or the worker stopping) and the item must go back to the queue (the caller
    does it, after it has stopped renewing the lease).
    """
    engine = engine or EngineHealth(rt.settings)
    if not rt.queue.lease_current(item_id, lease):
        return "stale"
    row = _load(rt, item_id)
    if row is None or row.status != ItemStatus.pending.value:  # already settled by an earlier attempt
        rt.queue.complete(item_id, lease)
        return "done"
    body = json.loads(row.body)
    s = rt.settings
    failures = 0
    while True:
        batch = _batch_now(rt, row.batch_id)
        if batch.status != BatchStatus.in_progress.value:  # cancelled or expired since it was claimed
            rt.queue.complete(item_id, lease)
            maybe_finalize(rt, row.batch_id)
            return "abandoned"
        if not engine.may_send():  # leased but not sent, and the engine is down or the worker stopping
            return GIVEN_BACK
        try:
            outcome = submit(rt, row.url, body, batch.priority)
            break
        except Transient as exc:
            if engine_down(engine, exc):
                return GIVEN_BACK
            failures += 1
            if failures > s.retry_budget:
                outcome = Outcome(
                    status=ItemStatus.failed,
                    error_code="retry_budget_exhausted",
                    error_message=f"The engine failed {failures} times; last: {exc}",
                )
                break
            delay = min(s.retry_backoff_seconds * 2 ** (failures - 1), BACKOFF_CAP_SECONDS)
            log.info("item %s: %s; retry %d in %.2fs", item_id, exc, failures, delay)
            engine.hold.wait(delay)  # an outage found by another task, or a shutdown, ends the wait at once
            if not rt.queue.lease_current(item_id, lease):
                return "stale"
    # "dropped": the lease went stale, or another attempt wrote first.
    return outcome.status.value if record(rt, item_id, row.batch_id, lease, outcome) else "dropped"


@shared_task(name=task_names.RUN_ITEM, bind=True)
def run_item(self: Task, item_id: int, lease: str) -> str:
    ctx = worker_context(self.app)
    if not ctx.leases.start(item_id, lease):  # not started within its lease: the item went back to the queue
        return "stale"
    try:
        result = execute_item(ctx.rt, item_id, lease, ctx.engine)
    finally:
        ctx.leases.discard(item_id, lease)
    if result == GIVEN_BACK and give_back(ctx.rt, item_id, lease):  # renewals stopped first: nothing re-extends it
        HANDED_BACK.inc()
    return result
