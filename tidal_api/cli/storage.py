"""`tidal storage check`: does this host see the fleet's file storage? (What every process checks at start.)"""

import click

from config import load_settings


@click.group()
def storage() -> None:
    """File storage (TIDAL_STORAGE)."""


@storage.command()
@click.option("--reset", is_flag=True, help="Record this host's storage as the fleet's (after moving it on purpose).")
def check(reset: bool) -> None:
    """Write and read a sentinel, then check the fleet's sentinel is visible here."""
    from tidal_workers.blobs import StorageUnavailable
    from tidal_workers.blobs.sentinel import StorageNotShared
    from tidal_workers.blobs.sentinel import prepare_storage
    from tidal_workers.blobs.sentinel import reset_sentinel
    from tidal_workers.runtime import Runtime

    rt = Runtime(load_settings())
    try:
        sentinel = (reset_sentinel if reset else prepare_storage)(
            rt.blobs, rt.redis, "tidal storage check", rt.settings.node
        )
        location = rt.blobs.location
    except (StorageNotShared, StorageUnavailable) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        rt.close()
    click.echo(f"storage {location}: the fleet's sentinel {sentinel.name} ({sentinel.by}) is visible here")


COMMANDS = [storage]
