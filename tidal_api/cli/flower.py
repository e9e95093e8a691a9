"""`tidal flower`: Celery's Flower UI on Tidal's broker, behind basic auth passed in its environment."""

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
    if not settings.flower_basic_auth and address not in ("127.0.0.1", "localhost", "::1"):
        raise click.UsageError("set TIDAL_FLOWER_BASIC_AUTH=user:password before exposing Flower")
    os.execve(sys.executable, argv, flower_environ(settings.flower_basic_auth))  # this interpreter's celery


def flower_environ(basic_auth: str) -> dict[str, str]:
    """This process's environment, with Flower's credentials in ``FLOWER_BASIC_AUTH``: an environment is readable
    only by its owner, a command line by anyone on the host (`ps`, /proc/*/cmdline)."""
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    if basic_auth:
        env["FLOWER_BASIC_AUTH"] = basic_auth
    return env


COMMANDS = [flower]
