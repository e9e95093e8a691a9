"""Helpers of the upgrade and restore tests: fresh databases, backups of them, and batches checked line by line."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import typing as t
import uuid
from pathlib import Path

import sqlalchemy as sa

from config import Settings
from tests.support.worker_helpers import ROOT
from tests.support.worker_helpers import on_stub
from tests.support.worker_helpers import settings_env
from tests.support.worker_helpers import settled
from tidal_api.cli.services import pg_bin


def stack_settings(settings: Settings, stub, **changes) -> Settings:
    """The stack of the upgrade and restore tests, which both kill a worker mid-batch: on the stub engine, with
    2-s leases and four requests in flight per worker, and ``changes``."""
    return on_stub(
        settings, stub, lease_seconds=2.0, claim_idle_seconds=0.02, max_inflight=4, worker_threads=4, **changes
    )


@contextlib.contextmanager
def fresh_database(settings: Settings, name: str) -> t.Iterator[Settings]:
    """``settings`` on a new, empty store: a new PostgreSQL database on the session's server, or a new SQLite file
    (a new home). Dropped at the end."""
    home = Path(settings.home).with_name(f"{Path(settings.home).name}-{name}")
    if not settings.database_url.startswith("postgresql"):
        yield settings.replace(home=str(home), database_url="", blob_dir="")
        return
    admin = sa.create_engine(settings.database_url, isolation_level="AUTOCOMMIT")
    db = f"tidal_{name}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{db}"'))
    url = admin.url.set(database=db).render_as_string(hide_password=False)
    try:
        yield settings.replace(home=str(home), database_url=url, blob_dir="")
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()


def libpq_url(settings: Settings) -> str:
    """The store's URL as pg_dump, pg_restore and psql take it (no SQLAlchemy driver name)."""
    return sa.make_url(settings.database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv[0]} failed: {done.stdout} {done.stderr}"


def backup(settings: Settings, to: Path) -> None:
    """What docs/deployment.md "Backup" does: the database first (pg_dump, or SQLite's online .backup), then the
    file storage (a copy of the blob directory). That order: a blob is written before its row, so every file the
    dump names has its bytes in the copy."""
    to.mkdir(parents=True)
    if settings.database_url.startswith("postgresql"):
        _run(pg_bin("pg_dump"), "--format=custom", f"--file={to / 'tidal.dump'}", libpq_url(settings))
    else:
        _run("sqlite3", settings.sqlalchemy_url.removeprefix("sqlite:///"), f".backup '{to / 'tidal.db'}'")
    shutil.copytree(settings.blob_path, to / "blobs")


def restore(backup_dir: Path, settings: Settings) -> None:
    """What docs/deployment.md "Restore" does, onto an empty store and an empty blob directory."""
    if settings.database_url.startswith("postgresql"):
        _run(pg_bin("pg_restore"), "--no-owner", f"--dbname={libpq_url(settings)}", str(backup_dir / "tidal.dump"))
    else:
        Path(settings.home).mkdir(parents=True)
        shutil.copy(backup_dir / "tidal.db", settings.sqlalchemy_url.removeprefix("sqlite:///"))
    shutil.copytree(backup_dir / "blobs", settings.blob_path)


def db_upgrade(settings: Settings) -> None:
    """What docs/deployment.md has an operator run after a new release or a restore: `tidal db upgrade`, a child
    process on ``settings``, which must succeed."""
    upgrade = subprocess.run(
        [sys.executable, "-m", "tidal_api.cli", "db", "upgrade"],
        cwd=ROOT,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upgrade.returncode == 0, upgrade.stderr[-3000:]


def scalar(settings_or_engine, sql: str, **params) -> t.Any:
    """One value by plain SQL: the schema may be another release's, so no ORM model is used."""
    engine = sa.create_engine(settings_or_engine.sqlalchemy_url)
    try:
        with engine.connect() as c:
            return c.execute(sa.text(sql), params).scalar()
    finally:
        engine.dispose()


def custom_ids(tag: str, n: int) -> list[str]:
    return [f"{tag}-{i}" for i in range(n)]


def assert_every_line_once(rt, batch_id: str, tag: str, n: int, timeout: float = 180) -> None:
    """The batch completed with exactly one output line per input line (``custom_ids(tag, n)``), no error line."""
    b, out, err = settled(rt, batch_id, timeout=timeout)
    assert err == [], err[:3]
    ids = sorted(line["custom_id"] for line in out)
    assert ids == sorted(custom_ids(tag, n)), f"{len(ids)} lines, {len(set(ids))} distinct, {n} expected"
    assert (b.total, b.completed, b.failed) == (n, n, 0)
    assert all(line["response"]["status_code"] == 200 for line in out)
