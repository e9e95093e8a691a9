"""The `tidal` command: one group, one module per sub-command family."""
import click

from tidal_api.cli import db, engine, serve, worker


@click.group()
def main() -> None:
    """Tidal: an OpenAI-compatible Batch API on the slack of live vLLM servers."""


for module in (db, engine, serve, worker):
    for command in module.COMMANDS:
        main.add_command(command)

__all__ = ["main"]
