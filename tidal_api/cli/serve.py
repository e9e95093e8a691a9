"""`tidal serve`: the API under gunicorn (gthread workers), configured by config/gunicorn.py."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

from config import load_settings
from config.settings import child_environ


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("gunicorn_args", nargs=-1, type=click.UNPROCESSED)
def serve(gunicorn_args: tuple[str, ...]) -> None:
    """Run the API. Extra arguments go to gunicorn and win over TIDAL_* settings (e.g. --bind :9000)."""
    # Each worker writes its /metrics samples here; a scrape of any worker merges them.
    # Files left by an earlier run would be merged too, so the directory starts empty.
    prom_dir = Path(load_settings().home) / "prometheus"
    shutil.rmtree(prom_dir, ignore_errors=True)
    prom_dir.mkdir(parents=True)
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "--config",
        "python:config.gunicorn",
        *gunicorn_args,
        "tidal_api.wsgi:app",
    ]
    # gunicorn becomes this process: signals reach its master directly.
    os.execve(sys.executable, argv, child_environ(PROMETHEUS_MULTIPROC_DIR=str(prom_dir)))


COMMANDS = [serve]
