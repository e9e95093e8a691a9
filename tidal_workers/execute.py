"""The ``tidal.run_item`` task: one attempt through prefetched → sent → answered → released.

The task waits in the node's LeaseBook for an engine token (the gate's target bounds requests at the
engine, not leases), then re-checks its lease and its batch's status and priority and POSTs, so an
escalation or a cancel reaches items claimed but not yet sent. With ``TIDAL_PREFILL_STAGE_TOKENS`` set, a whole
item's prompt is first warmed in the engine's prefix cache a chunk per request (``staging.py``), so no engine step
carries all of it. The token is freed the moment the POST
returns. A failed request is judged by ``policy.outage`` (``engine_health``): if the engine is down
(refused, or failing its ``/health``), the node pauses its book and the item goes back to the queue with
no retry spent, as does every item of the node not at the engine; an item whose request was at the engine
when it died has the death counted, and is an ``engine_crash`` error line once it has been at
``engine_crash_limit`` deaths (``poison.py``). Otherwise the failure (a timeout, a broken connection, a 5xx,
a 429) is the item's own: retried with exponential backoff while the renewal thread keeps the lease, and an
error line once ``retry_budget`` is spent. A 4xx is the request's own fault: an error line with the engine's
status and body; except a 400 that refuses the request's ``priority``, the engine's misconfiguration, which
fails the node's preflight and hands the item back (``preflight.py``). See docs/architecture.md, "The lease
state machine".

Phase split: an item's run is of the phase SQL holds (``items.phase``). A split item's prefill posts its body cut to one
token and tagged for the freeze connector; once it answers, the item is queued again as its decode (SQL first,
then the queue) and nothing is recorded: no output line, no usage. The decode posts the item's own body with the
tag and is recorded as a whole item is, so its usage is billed once (the prompt tokens it thawed show as cached).
A decode whose frozen KV is gone is an ordinary request to the engine, which recomputes the prompt.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import time
import typing as t

import prometheus_client
import requests
import urllib3.exceptions
from celery import Task
from celery import shared_task
from sqlalchemy import bindparam
from sqlalchemy import select
from sqlalchemy import update

from tidal_workers import task_names
from tidal_workers.attempt import Attempt
from tidal_workers.attempt import Ending
from tidal_workers.context import worker_context
from tidal_workers.engine_health import HANDED_BACK
from tidal_workers.engine_health import EngineHealth
from tidal_workers.finalize import request_finalize_if_due
from tidal_workers.handback import give_back
from tidal_workers.leases import LeaseBook
from tidal_workers.own_requests import OWN
from tidal_workers.poison import quarantine
from tidal_workers.policy.outage import Failure
from tidal_workers.policy.phase import Phase
from tidal_workers.policy.phase import phase_request
from tidal_workers.policy.pricing import Usage
from tidal_workers.preflight import refuses_priority
from tidal_workers.result import Entry
from tidal_workers.result import Outcome
from tidal_workers.result import Write
from tidal_workers.result import lease_current
from tidal_workers.result import record
from tidal_workers.runtime import Runtime
from tidal_workers.staging import warm_prompt
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus

log = logging.getLogger(__name__)

BACKOFF_CAP_SECONDS = 30.0

# Dispatch overhead is milliseconds against requests of seconds: buckets from 1 ms to 10 min.
_MILLISECONDS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.02, 0.05)  # where the medians sit
_BUCKETS = (*_MILLISECONDS, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0)
TOKEN_TO_POST = prometheus_client.Histogram(
    "tidal_dispatch_token_to_post_seconds",
    "An engine token freed (a batch request answered) to the next batch POST sent on this node.",
    buckets=_BUCKETS,
)
POST_SECONDS = prometheus_client.Histogram(
    "tidal_dispatch_post_seconds", "One batch POST to the engine, sent to answered.", buckets=_BUCKETS
)
RELEASE_SECONDS = prometheus_client.Histogram(
    "tidal_dispatch_release_seconds",
    "A batch POST answered to its lease released (the result written, the lease dropped).",
    buckets=_BUCKETS,
)


class Transient(Exception):
    """The engine may answer next time; ``failure`` says how this request failed."""

    def __init__(self, failure: Failure, message: str):
        super().__init__(message)
        self.failure = failure


def failure_of(exc: requests.RequestException) -> Failure:
    """What an engine call's exception says: refused (nothing listens), timed out, or broken."""
    if isinstance(exc, requests.ConnectionError) and not isinstance(exc, requests.Timeout):
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        return Failure.REFUSED if isinstance(reason, urllib3.exceptions.NewConnectionError) else Failure.BROKEN
    return Failure.TIMEOUT if isinstance(exc, requests.Timeout) else Failure.BROKEN


class Loaded(t.NamedTuple):
    """An attempt's item, as read when its task starts."""

    batch_id: str
    url: str
    body: str
    status: str
    phase: str


class BatchNow(t.NamedTuple):
    """An item's batch as of a submission (escalation and cancel reach items claimed but not yet sent)."""

    status: str
    priority: int
    tenant_id: str


# The reads and the write of every attempt, built once and run on the driver's cursor at each execution (as
# result's writes, and for the same reason: the item path's one way into the store, ``Store``).
_ITEM = select(*(getattr(Item, f) for f in Loaded._fields)).where(Item.id == bindparam("item_id"))
_BATCH_NOW = select(*(getattr(Batch, f) for f in BatchNow._fields)).where(Batch.id == bindparam("batch_id"))
_TO_DECODE = (
    update(Item)
    .where(Item.id == bindparam("item_id"), Item.status == ItemStatus.pending.value, Item.phase == Phase.PREFILL.value)
    .values(phase=Phase.DECODE.value)
)


def _load(rt: Runtime, item_id: int) -> Loaded | None:
    with rt.store.driver_transaction() as cursor:
        row = rt.store.driver(_ITEM).one_or_none(cursor, {"item_id": item_id})
    return Loaded(*row) if row is not None else None


def _batch_now(rt: Runtime, batch_id: str) -> BatchNow:
    with rt.store.driver_transaction() as cursor:
        row = rt.store.driver(_BATCH_NOW).one_or_none(cursor, {"batch_id": batch_id})
    assert row is not None, batch_id  # a batch outlives its items' attempts
    return BatchNow(*row)


@functools.lru_cache(maxsize=1024)
def cache_salt(secret: str, tenant: str) -> str:
    """The tenant's ``cache_salt``: vLLM shares cached prefix blocks only between requests of equal salt, so a
    tenant's prompts are never a cache hit for another tenant or for online traffic (which sends none), and
    ``cached_tokens`` tells no one about anyone else's prompts. Tenants cannot set one (the body policy bans it)."""
    return hmac.new(secret.encode() or b"tidal-cache-salt", tenant.encode(), hashlib.sha256).hexdigest()[:32]


def engine_fields(rt: Runtime, priority: int, tenant: str) -> dict[str, t.Any]:
    """What every request of an item carries to the engine besides its body: its batch's priority and its
    tenant's cache salt (its staged warm-ups too, or the item would not hit their blocks)."""
    return {"priority": priority, "cache_salt": cache_salt(rt.settings.cache_salt_secret, tenant)}


TAIL_BYTES = 64 * 1024  # what is kept of an answer past the cap: its end, where vLLM writes ``usage``


def read_capped(chunks: t.Iterable[bytes], cap: int) -> tuple[bytes | None, bytes, int]:
    """(the whole answer, or None past ``cap`` bytes; its last ``TAIL_BYTES``; its size): an answer is read through
    whatever its size, but never held past the cap."""
    kept, tail, size = bytearray(), b"", 0
    for chunk in chunks:
        size += len(chunk)
        if size <= cap:
            kept += chunk
            continue
        if kept:
            tail, kept = bytes(kept[-TAIL_BYTES:]), bytearray()
        tail = (tail + chunk)[-TAIL_BYTES:]
    return (bytes(kept) if size <= cap else None), tail, size


def usage_in_tail(tail: bytes) -> Usage:
    """The ``usage`` object at the end of a truncated answer, or none when the tail does not hold it whole."""
    at = tail.rfind(b'"usage"')
    colon = tail.find(b":", at)
    if at < 0 or colon < 0:
        return Usage()
    try:
        usage, _end = json.JSONDecoder().raw_decode(tail[colon + 1 :].decode("utf-8", "replace").lstrip())
    except ValueError:
        return Usage()
    return Usage.from_response(usage) if isinstance(usage, dict) else Usage()


def submit(rt: Runtime, url: str, body: dict[str, t.Any], priority: int, tenant: str) -> Outcome:
    """One POST to the engine on the process's pooled client; raises Transient for anything worth retrying.

    The answer is read in chunks and kept only up to ``TIDAL_MAX_RESPONSE_BYTES``: past it the item is an error line
    ``response_too_large``, with the usage the answer ends with recorded on the item."""
    s = rt.settings
    try:
        with rt.http.post(
            s.vllm_url.rstrip("/") + url,
            json={**body, **engine_fields(rt, priority, tenant)},
            timeout=s.request_timeout_seconds,
            stream=True,
        ) as resp:
            raw, tail, size = read_capped(resp.iter_content(TAIL_BYTES), s.max_response_bytes)
    except requests.RequestException as exc:
        raise Transient(failure_of(exc), f"{type(exc).__name__}: {exc}") from exc
    if resp.status_code == 429 or resp.status_code >= 500:
        failure = Failure.BUSY if resp.status_code == 429 else Failure.SERVER_ERROR
        said = (raw or tail)[:200].decode("utf-8", "replace")
        raise Transient(failure, f"engine answered {resp.status_code}: {said}")
    ok = 200 <= resp.status_code < 300
    if raw is None:
        return Outcome(
            status=ItemStatus.failed,
            request_id=resp.headers.get("x-request-id"),
            error_code="response_too_large",
            error_message=f"The engine's answer was {size:,} bytes, over this deployment's limit of "
            f"{s.max_response_bytes:,} (TIDAL_MAX_RESPONSE_BYTES); ask for fewer tokens or logprobs.",
            usage=usage_in_tail(tail) if ok else Usage(),
        )
    text = raw.decode("utf-8", "replace")
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise Transient(Failure.BROKEN, f"engine answered {resp.status_code} with a body that is not JSON") from exc
    request_id = resp.headers.get("x-request-id") or (payload.get("id") if isinstance(payload, dict) else None)
    return Outcome(
        status=ItemStatus.completed if ok else ItemStatus.failed,
        response_status=resp.status_code,
        request_id=request_id,
        body=text,
        usage=Usage.from_response(payload.get("usage")) if ok and isinstance(payload, dict) else Usage(),
    )


def _post(rt: Runtime, book: LeaseBook, engine: EngineHealth, attempt: Attempt, row: Loaded) -> Outcome | Ending:
    """prefetched → sent → answered, retrying the item's own transient failures; the Outcome, or why it stopped."""
    s = rt.settings
    body = phase_request(json.loads(row.body), Phase(row.phase), row.batch_id)
    failures = 0
    while True:
        got, freed_at = book.take_token(attempt, s.prefetch_max_age_seconds)
        if not got:  # no token within the prefetch age, or the book is paused (engine down, worker stopping)
            given = give_back(rt, attempt)
            if given is Ending.GIVEN_BACK and not engine.up:
                HANDED_BACK.inc()
            return given
        # The re-checks, at the moment of sending: the lease, then the batch's status and priority now.
        if not lease_current(rt, book, attempt):
            book.return_token(attempt, freed_at)
            return Ending.STALE
        batch = _batch_now(rt, row.batch_id)
        if batch.status != BatchStatus.in_progress.value:  # cancelled or expired since it was claimed
            book.return_token(attempt, freed_at)
            rt.queue.complete(attempt)
            request_finalize_if_due(rt, row.batch_id)
            return Ending.ABANDONED
        sent = time.monotonic()
        if freed_at is not None:
            TOKEN_TO_POST.observe(sent - freed_at)
        warmed = 0
        if row.phase == Phase.WHOLE.value:  # a split item's phases are the freeze connector's: never staged
            warmed = warm_prompt(rt, row.url, body, engine_fields(rt, batch.priority, batch.tenant_id))
        OWN.sent()
        try:
            outcome = submit(rt, row.url, body, batch.priority, batch.tenant_id)
        except Transient as exc:
            failed = exc
        else:
            if outcome.usage.input_tokens:  # the engine finished it: the gate's count of this node's own work
                OWN.item(outcome.usage.input_tokens, outcome.usage.output_tokens, warmed)
            if not refuses_priority(outcome.response_status, outcome.body):
                return outcome
            engine.refused(f"{outcome.response_status}: {outcome.body}")  # the engine's fault, not the item's:
            continue  # the book is paused, so the next take_token hands the item back, no retry spent
        finally:
            book.answered(attempt)
            POST_SECONDS.observe(time.monotonic() - sent)
        if engine.outage(failed.failure, str(failed)):  # no retry spent: the book is paused, so the next
            # take_token hands the item back, unless the engine died while it was at it once too often
            crashed = quarantine(rt, attempt.item_id, str(failed)) if failed.failure is not Failure.REFUSED else None
            if crashed is not None:
                return crashed
            continue
        failures += 1
        if failures > s.retry_budget:
            return Outcome(
                status=ItemStatus.failed,
                error_code="retry_budget_exhausted",
                error_message=f"The engine failed {failures} times; last: {failed}",
            )
        delay = min(s.retry_backoff_seconds * 2 ** (failures - 1), BACKOFF_CAP_SECONDS)
        log.info("item %s: %s; retry %d in %.2fs", attempt.item_id, failed, failures, delay)
        # The token is free meanwhile and the renewal thread keeps the lease; an outage found by another task, or
        # the worker stopping, pauses the book and ends the wait at once (the next take_token hands the item back).
        book.paused.wait(delay)
        if not lease_current(rt, book, attempt):
            return Ending.STALE


def prefilled(rt: Runtime, attempt: Attempt) -> Ending:
    """A split item's prefill answered (its KV is frozen): queue it as its decode, if its lease is still current.

    SQL first, which a rebuild reads; should the queue's step not follow (the lease lost, the process dying), the
    item's next run reads ``decode`` there whatever set it was claimed from. Returns PREFILLED, or ABANDONED
    (the batch was dropped) or STALE as ``handback.give_back``.
    """
    if not lease_current(rt, None, attempt):  # Redis itself: the move to decode must not outlive the lease
        return Ending.STALE
    with rt.store.driver_transaction() as cursor:
        rt.store.driver(_TO_DECODE).run(cursor, {"item_id": attempt.item_id})
    given = give_back(rt, attempt, as_phase=Phase.DECODE.value)
    return Ending.PREFILLED if given is Ending.GIVEN_BACK else given


def execute_item(
    rt: Runtime,
    book: LeaseBook,
    attempt: Attempt,
    write: Write | None = None,
    engine: EngineHealth | None = None,
) -> Ending:
    """Run one claimed attempt (booked in ``book``) to its end; returns how it ended (for Flower and tests).
    ``write``: the worker's ResultWriter (group commit); by default the outcome gets a transaction of its own.
    ``engine``: the worker's EngineHealth; by default one of this call's own."""
    engine = engine or EngineHealth(rt, book)
    if not book.start(attempt) or not lease_current(rt, book, attempt):
        return Ending.STALE
    row = _load(rt, attempt.item_id)
    if row is None or row.status != ItemStatus.pending.value:  # already settled by an earlier attempt
        rt.queue.complete(attempt)
        return Ending.DONE
    outcome = _post(rt, book, engine, attempt, row)
    if isinstance(outcome, Ending):
        return outcome
    if row.phase == Phase.PREFILL.value and outcome.status is ItemStatus.completed:
        done = prefilled(rt, attempt)
        book.discard(attempt)
        return done
    answered = time.monotonic()
    written = record(rt, Entry(attempt, row.batch_id, outcome), write, book)
    book.discard(attempt)  # released: the claim loop may fill the room
    RELEASE_SECONDS.observe(time.monotonic() - answered)
    if written:  # the write asked for the batch's finalize if it was due (result.commit_and_release)
        return Ending(outcome.status.value)
    request_finalize_if_due(rt, row.batch_id)  # the lease went stale, or another attempt wrote first
    return Ending.DROPPED


@shared_task(name=task_names.RUN_ITEM, bind=True)
def run_item(self: Task, item_id: int, lease: str) -> Ending:
    """The message carries the attempt's two fields (``attempt.py``)."""
    ctx = worker_context(self.app)
    attempt = Attempt(item_id, lease)
    try:
        return execute_item(ctx.rt, ctx.leases, attempt, ctx.results.write, ctx.engine)
    finally:
        ctx.leases.discard(attempt)
