"""Fixtures for dispatch tests: a batch factory (direct SQL inserts), a fault-injecting stub engine, real workers.

Workers are real Celery workers on the real Redis broker: in a thread
(``celery.contrib.testing.worker.start_worker``, threads pool) or, where a test
must kill one, a ``tidal worker`` subprocess.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid

import pytest
import sqlalchemy as sa
from celery.contrib.testing.worker import start_worker

from tidal_workers.celery_app import make_celery
from tidal_workers.enqueue import enqueue_batch
from tidal_workers.gate import pool_threads
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Item


@pytest.fixture
def settings(settings, stub):
    """Short leases, retries and windows, so faults and recovery show up in seconds."""
    return settings.replace(
        vllm_url=stub.url,
        gate_mode="fixed",  # the AIMD gate has its own tests; here the target is max_inflight
        lease_seconds=1.5,
        claim_idle_seconds=0.02,
        retry_backoff_seconds=0.02,
        retry_budget=3,
        request_timeout_seconds=1.0,
        max_inflight=4,
        worker_threads=4,
        reclaim_seconds=0.5,
        beat_lock_seconds=2,
    )


@pytest.fixture
def empty_store_url(database_url, tmp_path):
    """An empty database of the session's kind, for a migration test to build from an old revision."""
    if database_url is None:
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    admin = sa.create_engine(database_url, isolation_level="AUTOCOMMIT")
    name = f"tidal_mig_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield admin.url.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def make_batch(rt):
    """Insert an in-progress batch with ``n`` chat items (content = custom_id) and queue it."""
    counter = iter(range(1_000_000))

    def make(
        n: int = 4,
        priority: int = 100,
        expires_in: float | None = None,
        ordinals=None,
        enqueue: bool = True,
        tenant: str = "acme",
        model: str = "m",
        max_tokens: int | None = None,
        extra_body: dict | None = None,
    ) -> str:
        k = next(counter)
        now = int(time.time())
        window = rt.settings.completion_window_seconds if expires_in is None else expires_in
        with rt.store.transaction() as s:
            f = File(tenant_id=tenant, filename="in.jsonl", purpose="batch", bytes=0, created_at=now, blob="none")
            s.add(f)
            s.flush()
            b = Batch(
                tenant_id=tenant,
                endpoint="/v1/chat/completions",
                model=model,
                input_file_id=f.id,
                completion_window="24h",
                status=BatchStatus.in_progress.value,
                created_at=now,
                in_progress_at=now,
                expires_at=int(now + window),
                total=n,
                priority=priority,
            )
            s.add(b)
            s.flush()
            for i in range(n):
                cid = f"b{k}-{i}"
                body = {"model": model, "messages": [{"role": "user", "content": cid}]}
                if max_tokens is not None:
                    body["max_tokens"] = max_tokens
                body.update(extra_body or {})
                s.add(
                    Item(
                        batch_id=b.id,
                        line=i + 1,
                        ordinal=ordinals[i] if ordinals else i,
                        custom_id=cid,
                        url="/v1/chat/completions",
                        body=json.dumps(body),
                    )
                )
            batch_id = b.id
        if enqueue:
            enqueue_batch(rt, batch_id)
        return batch_id

    return make


@pytest.fixture
def celery_app(settings):
    return make_celery(settings)


@pytest.fixture
def worker(celery_app, rt):
    """A real worker (threads pool, ClaimStep) in this process, as a context manager factory."""

    @contextlib.contextmanager
    def run(hostname: str = "tidal@test-node"):
        with start_worker(
            celery_app,
            pool="threads",
            concurrency=pool_threads(rt.settings),
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=20,
            hostname=hostname,
        ) as w:
            yield w
        alive = [t.name for t in threading.enumerate() if t.name == "tidal-claim"]
        assert not alive, "a claim thread outlived its worker"

    return run
