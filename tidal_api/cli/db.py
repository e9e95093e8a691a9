"""`tidal db upgrade`: apply schema migrations and store the configured keys."""

import click

from config import load_settings


@click.group()
def db() -> None:
    """The SQL store."""


@db.command()
def upgrade() -> None:
    """Migrate the schema to the newest revision and store the configured API keys (adds and moves; never revokes)."""
    from tidal_workers.store import Store
    from tidal_workers.store import api_keys

    store = Store(load_settings())
    store.migrate()
    api_keys.sync(store)
    click.echo(f"store ready: {store.engine.url.render_as_string(hide_password=True)}")


COMMANDS = [db]
