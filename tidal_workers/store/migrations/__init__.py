"""Alembic migrations of the SQL store (run by Store.migrate / `tidal db upgrade`)."""
