"""Alembic environment: the engine comes from the caller (see migrate.py), never from a file."""

from alembic import context

from tidal_workers.store.models import Base

engine = context.config.attributes["engine"]
with engine.begin() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
