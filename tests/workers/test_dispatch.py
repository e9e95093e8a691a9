"""End to end through a real Celery worker (threads pool, ClaimStep) and a stub engine on loopback."""

from __future__ import annotations

import re

from celery.signals import task_prerun
from sqlalchemy import select

from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import item_ids
from tests.support.worker_helpers import settled
from tidal_engine.serve import free_port
from tidal_workers import task_names
from tidal_workers.execute import cache_salt
from tidal_workers.execute import submit
from tidal_workers.store.models import Item
from tidal_workers.store.models import ItemStatus


def test_batch_runs_to_completed_with_openai_lines_usage_and_priority(rt, make_batch, worker, stub):
    batch = make_batch(6, priority=37)
    started = []

    def seen(sender=None, task_id=None, **_):
        if sender.name == task_names.RUN_ITEM:  # not the ops worker's finalize, which this worker also consumes
            started.append(task_id)

    task_prerun.connect(seen, weak=False)
    try:
        with worker():
            b, out, err = settled(rt, batch)
    finally:
        task_prerun.disconnect(seen)

    assert (b.status, b.completed, b.failed, b.total, err) == ("completed", 6, 0, 6, [])
    assert b.finalizing_at and b.completed_at and b.error_file_id is None
    assert (b.input_tokens, b.cached_tokens, b.output_tokens) == (6 * 7, 6 * 2, 6 * 3)
    assert_exactly_once(rt, batch, out, err)
    line = out[0]
    assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
    assert line["response"]["status_code"] == 200 and line["response"]["request_id"].startswith("req-")
    assert line["response"]["body"]["usage"]["prompt_tokens"] == 7
    assert line["response"]["body"]["choices"][0]["message"]["content"] == f"echo {line['custom_id']}"
    assert {body["priority"] for body in stub.requests} == {37}
    # Flower names each run by its item and attempt (a claim whose task had not started within the tests' 1.5 s
    # lease on a loaded machine is given back and runs again as attempt 2: still once in the output)
    assert all(re.fullmatch(r"item-\d+#\d+", name) for name in started), started
    assert {name.split("#")[0] for name in started} == {f"item-{i}" for i in item_ids(rt, batch)}
    with rt.store.read() as s:
        assert set(s.scalars(select(Item.input_tokens).where(Item.batch_id == batch))) == {7}


def test_each_tenants_requests_carry_its_own_cache_salt(rt, make_batch, worker, stub, settings):
    """vLLM shares cached prefix blocks only between requests of one salt: one salt per tenant, from the server's
    secret, so no tenant's prompts hit another's cache, nor online traffic's (which sends none)."""
    batches = {tenant: make_batch(3, tenant=tenant) for tenant in ("acme", "globex")}
    with worker():
        for batch in batches.values():
            settled(rt, batch)
    salts = {body["messages"][0]["content"]: body["cache_salt"] for body in stub.requests}
    acme = {salts[f"b0-{i}"] for i in range(3)}
    globex = {salts[f"b1-{i}"] for i in range(3)}
    assert len(acme) == len(globex) == 1 and acme != globex  # the same within a tenant, apart between tenants
    assert acme == {cache_salt(settings.cache_salt_secret, "acme")}
    assert cache_salt("s" * 32, "acme") != cache_salt("t" * 32, "acme")  # the secret's: not computable without it


def test_5xx_429_and_aborts_are_retried_not_counted_and_4xx_is_an_error_line(rt, make_batch, worker, stub):
    batch = make_batch(4)
    stub.script("b0-0", "500", "429", "503")
    stub.script("b0-1", "abort", "hang")
    stub.script("b0-2", "400")
    with worker():
        b, out, err = settled(rt, batch)

    assert (b.completed, b.failed) == (3, 1)
    assert stub.seen("b0-0") == 4 and stub.seen("b0-1") == 3 and stub.seen("b0-2") == 1
    assert_exactly_once(rt, batch, out, err)
    (bad,) = err
    assert bad["custom_id"] == "b0-2" and bad["error"] is None
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["message"] == "stub fault 400"


def test_retry_budget_spent_becomes_an_error_line(rt, make_batch, worker, stub, settings):
    batch = make_batch(2)
    stub.script("b0-1", *["503"] * (settings.retry_budget + 1))
    with worker():
        b, _out, err = settled(rt, batch)
    assert (b.completed, b.failed) == (1, 1)
    (bad,) = err
    assert bad["response"] is None and bad["error"]["code"] == "retry_budget_exhausted"
    assert stub.seen("b0-1") == settings.retry_budget + 1


def test_queue_lost_mid_batch_is_rebuilt_from_sql_and_completes(rt, make_batch, worker, stub):
    """FLUSHDB of Tidal's Redis DB (FLUSHALL would also wipe other tests' DBs on this shared Redis)."""
    stub.delay = 0.1
    batch = make_batch(30)
    with worker():
        wait_for(lambda: batch_row(rt, batch).completed >= 5, what="a few items to finish")
        rt.redis.flushdb()
        b, out, err = settled(rt, batch)
    assert (b.completed, b.failed, err) == (30, 0, [])
    assert_exactly_once(rt, batch, out, err)


def test_the_engine_client_takes_no_proxy_from_the_environment(rt, stub, monkeypatch):
    """Settings come from config alone: a proxy in the environment (here one that refuses) never carries the POSTs
    to the co-located engine, and requests does not read the environment on each of them."""
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert submit(rt, "/v1/chat/completions", body, 100, "acme").status is ItemStatus.completed
