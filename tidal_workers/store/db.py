"""Engine and session handling for SQLite (WAL) and PostgreSQL: the two ways into the store (``Store``)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import typing as t

from sqlalchemy import CursorResult
from sqlalchemy import Delete
from sqlalchemy import Select
from sqlalchemy import Update
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.orm import Session
from sqlalchemy.orm import sessionmaker

from config import Settings
from tidal_workers.store.models import Base

#: What ``Store.driver`` compiles: one row per call of the item path at most (a SELECT, or an UPDATE's RETURNING).
Statement = Select[*tuple[t.Any, ...]] | Update | Delete


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


def rows_updated(
    session: Session | Connection, stmt: Update | Delete, params: t.Mapping[str, t.Any] | None = None
) -> int:
    """Run an UPDATE (or DELETE), with ``params`` bound if given, and return how many rows it changed (a
    conditional UPDATE's 1 is an election won)."""
    result = session.execute(stmt, params)
    assert isinstance(result, CursorResult)  # what an UPDATE returns; Session.execute is typed for SELECTs
    return result.rowcount


@dataclasses.dataclass(frozen=True)
class DriverStatement:
    """A Core statement compiled once for one database, to run on the driver's own cursor (``Store.driver``).

    For the statements run for every item: on them SQLAlchemy's execution machinery (the compiled-cache lookup, the
    execution context, the result object) cost more than SQLite spends running them (measured on a result write:
    0.51 ms through a Core connection, 0.20 ms on the driver's cursor). Only for statements whose bound values and
    columns need no type conversion (plain integers and strings), as nothing converts them here."""

    sql: str
    names: tuple[str, ...] | None  # a positional driver's (sqlite3's qmark) bound names in order; None: by name
    constants: t.Mapping[str, t.Any]  # the statement's own literals (``status = 'pending'``), bound as any name

    @classmethod
    def compile(cls, statement: Statement, dialect: Dialect) -> DriverStatement:
        compiled = statement.compile(dialect=dialect)
        constants = {name: bind.value for name, bind in compiled.binds.items() if not bind.required}
        names = tuple(compiled.positiontup) if compiled.positiontup is not None else None
        return cls(compiled.string, names, constants)

    def run(self, cursor: DBAPICursor, values: t.Mapping[str, t.Any]) -> DBAPICursor:
        """Execute with ``values`` bound by name (the statement's own literals added); the cursor, to read from."""
        bound = {**self.constants, **values}
        cursor.execute(self.sql, tuple(bound[n] for n in self.names) if self.names is not None else bound)
        return cursor

    def one_or_none(self, cursor: DBAPICursor, values: t.Mapping[str, t.Any]) -> tuple[t.Any, ...] | None:
        """Execute, then the first row (a SELECT's, or an UPDATE's RETURNING), or None if there is none."""
        row = self.run(cursor, values).fetchone()
        return tuple(row) if row is not None else None


class Store:
    """The database of one process: an engine, a session factory and start-up helpers.

    Two ways in, each for its own path:

    * ``read`` and ``transaction``, an ORM ``Session``: the API, ingest, finalize, the sweeps and the CLI, whose
      work per call is large or rare (a request, a batch), so clarity wins.
    * ``driver`` and ``driver_transaction``, a statement compiled once and run on the driver's own cursor: the item
      path alone (``execute``, ``result``, ``poison`` and ``finalize``'s counts read), whose statements run once or
      more per item on every GPU node, where SQLAlchemy's machinery costs more than the database's work
      (``DriverStatement``). A statement on this path is a module-level constant, bound at each execution.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        if settings.sqlalchemy_url.startswith("sqlite"):
            from pathlib import Path

            Path(settings.home).mkdir(parents=True, exist_ok=True)
        self.engine = make_engine(settings.sqlalchemy_url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._driver_statements: dict[Statement, DriverStatement] = {}

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

    def driver(self, statement: Statement) -> DriverStatement:
        """``statement`` compiled for this store's database, once per process (``DriverStatement``)."""
        compiled = self._driver_statements.get(statement)
        if compiled is None:
            compiled = self._driver_statements[statement] = DriverStatement.compile(statement, self.engine.dialect)
        return compiled

    @contextlib.contextmanager
    def driver_transaction(self) -> t.Iterator[DBAPICursor]:
        """A driver cursor on a pooled connection, in a transaction, for ``DriverStatement``s: committed on
        success (a read's too: it ends the transaction PostgreSQL's driver opened) and rolled back on error (a
        connection that cannot even roll back is dropped from the pool)."""
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            try:
                yield cursor
            finally:
                cursor.close()
            connection.commit()
        except BaseException:
            try:
                connection.rollback()
            except Exception:
                connection.invalidate()
            raise
        finally:
            connection.close()  # back to the pool

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision."""
        from tidal_workers.store.migrate import upgrade

        upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()


__all__ = ["Base", "DriverStatement", "Store", "make_engine", "rows_updated"]
