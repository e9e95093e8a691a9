"""Helpers of the migration tests: a store left at an older revision, holding the rows that revision had."""

from __future__ import annotations

import sqlalchemy as sa

from tidal_workers.store.db import make_engine
from tidal_workers.store.migrate import upgrade


def store_at(url: str, revision: str, rows: dict[str, list[dict]]) -> sa.Engine:
    """The store at ``url`` upgraded to ``revision`` only, with ``rows`` (table name: rows) inserted through that
    revision's own schema (reflected, since today's models describe the head)."""
    engine = make_engine(url)
    upgrade(engine, revision)
    meta = sa.MetaData()
    meta.reflect(engine)
    with engine.begin() as c:
        for table, values in rows.items():
            c.execute(meta.tables[table].insert(), values)
    return engine
