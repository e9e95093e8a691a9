"""The `tidal` command: one group, one module per sub-command family."""

import typing as t

import click

from config.settings import SettingsError
from tidal_api.cli import bench
from tidal_api.cli import config_cmd
from tidal_api.cli import db
from tidal_api.cli import engine
from tidal_api.cli import flower
from tidal_api.cli import keys
from tidal_api.cli import report
from tidal_api.cli import serve
from tidal_api.cli import storage
from tidal_api.cli import up
from tidal_api.cli import watch
from tidal_api.cli import worker


class _Tidal(click.Group):
    def invoke(self, ctx: click.Context) -> t.Any:
        """A bad TIDAL_* variable is a usage error: its message, no traceback, exit status 1."""
        try:
            return super().invoke(ctx)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_Tidal)
def main() -> None:
    """Tidal: an OpenAI-compatible Batch API on the slack of live vLLM servers."""


for module in (bench, config_cmd, db, engine, flower, keys, report, serve, storage, up, watch, worker):
    for command in module.COMMANDS:
        main.add_command(command)

__all__ = ["main"]
