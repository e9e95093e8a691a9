"""`tidal flower`: Celery's Flower UI on Tidal's broker, behind basic auth."""

import os
import sys

import click

from config import load_settings


@click.command()
@click.option("--port", type=int, default=None, help="Default: TIDAL_FLOWER_PORT.")
@click.option("--address", default="0.0.0.0", show_default=True)
def flower(port: int | None, address: str) -> None:
    """Run Flower; it refuses to start without TIDAL_FLOWER_BASIC_AUTH unless --address is loopback."""
    settings = load_settings()
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tidal_workers.celery_app",
        "flower",
        f"--address={address}",
        f"--port={port or settings.flower_port}",
        "--persistent=False",
        "--purge_offline_workers=60",
    ]
    if settings.flower_basic_auth:
        argv.append(f"--basic-auth={settings.flower_basic_auth}")
    elif address not in ("127.0.0.1", "localhost", "::1"):
        raise click.UsageError("set TIDAL_FLOWER_BASIC_AUTH=user:password before exposing Flower")
    os.execv(sys.executable, argv)  # this interpreter's celery, whatever PATH says


COMMANDS = [flower]
