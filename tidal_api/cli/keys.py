"""`tidal keys create|list|revoke`: API keys kept in the store, beside those TIDAL_API_KEYS configures."""

from __future__ import annotations

import datetime as dt
import json
import typing as t

import click

from config import load_settings

if t.TYPE_CHECKING:
    from tidal_workers.store import Store
    from tidal_workers.store.models import ApiKey


def _store() -> Store:
    from tidal_workers.store import Store

    store = Store(load_settings())
    store.migrate()
    return store


def _when(ts: int | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ") if ts else "-"


def _as_dict(k: ApiKey) -> dict[str, t.Any]:
    return {
        "id": k.id,
        "tenant": k.tenant_id,
        "name": k.name,
        "hint": k.hint,
        "source": k.source,
        "created_at": k.created_at,
        "last_used_at": k.last_used_at,
        "revoked_at": k.revoked_at,
    }


@click.group()
def keys() -> None:
    """API keys (stored as SHA-256 digests; a key is shown once, when created)."""


@keys.command()
@click.option("--tenant", required=True, help="The tenant the key acts for (created if new).")
@click.option("--name", default="", help="What the key is for, shown by `tidal keys list`.")
def create(tenant: str, name: str) -> None:
    """Create a key and print it: the only time it is shown."""
    from tidal_workers.store import api_keys

    if not tenant or len(tenant) > 64:
        raise click.BadParameter("1 to 64 characters", param_hint="--tenant")
    if len(name) > 128:
        raise click.BadParameter("at most 128 characters", param_hint="--name")
    row, key = api_keys.create(_store(), tenant, name)
    click.echo(f"created key {row.id} for tenant {tenant}; it is shown only now:", err=True)
    click.echo(key)


@keys.command("list")
@click.option("--tenant", default=None, help="Only this tenant's keys.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key.")
def list_keys(tenant: str | None, as_json: bool) -> None:
    """Every key: id, tenant, name, hint, source, created, last used (to the minute), revoked."""
    from tidal_workers.store import api_keys

    rows = api_keys.listed(_store(), tenant)
    if as_json:
        for row in rows:
            click.echo(json.dumps(_as_dict(row)))
        return
    click.echo(
        f"{'id':<21} {'tenant':<16} {'name':<20} {'hint':<12} {'source':<7} {'created':<21} {'last used':<21} revoked"
    )
    for k in rows:
        click.echo(
            f"{k.id:<21} {k.tenant_id[:16]:<16} {k.name[:20]:<20} {k.hint:<12} {k.source:<7} {_when(k.created_at):<21} "
            f"{_when(k.last_used_at):<21} {_when(k.revoked_at)}"
        )


@keys.command()
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke the key KEY_ID (from `tidal keys list`): every API process refuses it from its next request on."""
    from tidal_workers.store import api_keys

    row = api_keys.revoke(_store(), key_id)
    if row is None:
        raise click.ClickException(f"no key with id {key_id} (see `tidal keys list`)")
    if row.source == "config":
        click.echo(f"note: {key_id} comes from TIDAL_API_KEYS; remove it there too", err=True)
    click.echo(f"revoked {row.id} (tenant {row.tenant_id}) at {_when(row.revoked_at)}")


@keys.command()
@click.option("--prune", is_flag=True, help="Also revoke the configured keys TIDAL_API_KEYS no longer names.")
def sync(prune: bool) -> None:
    """Store the keys TIDAL_API_KEYS names (added, or moved to the tenant it names); every API start does this too.

    A configured key the setting no longer names stays live until a sync with --prune revokes it (each revocation
    is logged); --prune is refused when the setting names no key, as in a shell that lacks it.
    """
    from tidal_workers.store import api_keys

    store = _store()
    if prune and not store.settings.configured_keys:
        raise click.ClickException(
            "TIDAL_API_KEYS names no key: --prune would revoke every configured key (revoke one with `tidal keys revoke`)"
        )
    report = api_keys.sync(store, prune=prune)
    click.echo(
        f"added {report.added}, moved {report.moved}, revoked {report.revoked}, kept revoked {report.kept_revoked}, "
        f"left live though unlisted {report.unlisted}"
    )


COMMANDS = [keys]
