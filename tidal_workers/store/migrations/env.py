"""Alembic environment: the engine comes from the caller (see migrate.py), never from a file.

On SQLite, batch mode changes a table by rebuilding it (copy, drop, rename), and dropping a table that other rows
reference fails while foreign keys are enforced. So they are off during the migration (the pragma only takes
effect outside a transaction) and every reference is checked before they are back on.
"""

from alembic import context

from tidal_workers.store.models import Base

engine = context.config.attributes["engine"]
sqlite = engine.dialect.name == "sqlite"
with engine.connect() as connection:
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    try:
        with connection.begin():
            context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
            with context.begin_transaction():
                context.run_migrations()
        if sqlite:
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            connection.commit()
            if broken:
                raise RuntimeError(f"the migration left rows referencing nothing: {broken[:5]}")
    finally:
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.commit()
