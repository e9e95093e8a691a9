"""Engine and session handling for SQLite (WAL) and PostgreSQL."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
import typing as t

from sqlalchemy import CursorResult
from sqlalchemy import Update
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.orm import sessionmaker

from config import Settings
from tidal_workers.store.models import ApiKey
from tidal_workers.store.models import Base
from tidal_workers.store.models import Tenant


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(
            dbapi_conn: sqlite3.Connection, _record: object
        ) -> None:  # WAL lets readers run beside one writer
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def rows_updated(session: Session, stmt: Update) -> int:
    """Run an UPDATE and return how many rows it changed (a conditional UPDATE's 1 is an election won)."""
    result = session.execute(stmt)
    assert isinstance(result, CursorResult)  # what an UPDATE returns; Session.execute is typed for SELECTs
    return result.rowcount


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Store:
    """The database of one process: an engine, a session factory and start-up helpers."""

    def __init__(self, settings: Settings):
        self.settings = settings
        if settings.sqlalchemy_url.startswith("sqlite"):
            from pathlib import Path

            Path(settings.home).mkdir(parents=True, exist_ok=True)
        self.engine = make_engine(settings.sqlalchemy_url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def read(self) -> t.Iterator[Session]:
        """A session for reading: closed at the end, nothing in it is ever committed."""
        with self._sessions() as session:
            yield session

    @contextlib.contextmanager
    def transaction(self) -> t.Iterator[Session]:
        """A session committed on success and rolled back on error."""
        with self._sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision."""
        from tidal_workers.store.migrate import upgrade

        upgrade(self.engine)

    def sync_keys(self) -> None:
        """Store the configured keys (hashed) and their tenants."""
        now = int(time.time())
        with self.transaction() as s:
            for tenant, key in self.settings.configured_keys:
                if s.get(Tenant, tenant) is None:
                    s.add(Tenant(id=tenant, created_at=now))
                    s.flush()
                h = hash_key(key)
                if s.get(ApiKey, h) is None:
                    s.add(ApiKey(key_hash=h, tenant_id=tenant, created_at=now))
            if self.settings.env != "dev":  # the dev key must not outlive dev mode
                dev = s.get(ApiKey, hash_key("tidal-dev-key"))
                if dev is not None:
                    s.delete(dev)

    def tenant_for_key(self, key: str) -> str | None:
        with self.read() as s:
            row = s.execute(select(ApiKey.tenant_id).where(ApiKey.key_hash == hash_key(key))).first()
            return row[0] if row else None

    def dispose(self) -> None:
        self.engine.dispose()


__all__ = ["Base", "Store", "hash_key", "make_engine", "rows_updated"]
