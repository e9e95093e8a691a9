"""Shared fixtures: real Redis, a real SQL store (SQLite or PostgreSQL), a live API.

The services are never mocked. If Redis or PostgreSQL is down the suite fails
at start-up with the command that starts it; it never skips.
"""
from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from werkzeug.serving import make_server

from config import load_settings
from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Base

BASE = load_settings()
TEST_REDIS_DB = 13  # never the default DB 0 of a developer's Redis


def _redis_url(db: int) -> str:
    return BASE.redis_url.rsplit("/", 1)[0] + f"/{db}" if BASE.redis_url.count("/") >= 3 else BASE.redis_url + f"/{db}"


def pytest_sessionstart(session):
    try:
        redis.Redis.from_url(_redis_url(TEST_REDIS_DB)).ping()
    except redis.RedisError as exc:
        pytest.exit(f"Redis is not reachable at {BASE.redis_url} ({exc}); start it (see .ci/run)", returncode=3)


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
    store.sync_keys()
    yield runtime
    runtime.redis.flushdb()
    runtime.close()


class LiveServer:
    """A WSGI app served on loopback in a thread: real HTTP, real sockets."""

    def __init__(self, app):
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def live_api(rt):
    """The Flask API on a loopback port, sharing the test's Runtime."""
    from tidal_api import create_app

    server = LiveServer(create_app(runtime=rt))
    yield server
    server.stop()
