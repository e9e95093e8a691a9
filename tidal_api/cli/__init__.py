"""The `tidal` command: one group, one module per sub-command family.

Other packages add commands through the ``tidal.commands`` entry point group (setup.cfg): the benchmarks' `tidal
bench` comes that way, so the product's command imports nothing of them and runs where they are not installed.
"""

import logging
import typing as t
from importlib.metadata import entry_points

import click

from config.settings import SettingsError
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

PLUGIN_GROUP = "tidal.commands"

log = logging.getLogger(__name__)


class _Tidal(click.Group):
    """The built-in commands, and the plugin commands, loaded when the commands are listed or one not built in is
    asked for."""

    plugins_loaded = False

    def invoke(self, ctx: click.Context) -> t.Any:
        """A bad TIDAL_* variable is a usage error: its message, no traceback, exit status 1."""
        try:
            return super().invoke(ctx)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from exc

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:  # a built-in one runs without importing any plugin
            self.load_plugins()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_plugins()
        return super().list_commands(ctx)

    def load_plugins(self) -> None:
        """Add each command of the entry point group; one that is missing, broken or clashing is left out with one
        log line, so a broken plugin never breaks `tidal` itself."""
        if self.plugins_loaded:
            return
        self.plugins_loaded = True
        for point in entry_points(group=PLUGIN_GROUP):
            try:
                command = point.load()
            except Exception as exc:
                log.warning("tidal: command %r (%s) left out: %s: %s", point.name, point.value, type(exc).__name__, exc)
                continue
            if not isinstance(command, click.Command) or point.name in self.commands:
                log.warning("tidal: command %r (%s) left out: not a new click command", point.name, point.value)
                continue
            self.add_command(command, point.name)


@click.group(cls=_Tidal)
def main() -> None:
    """Tidal: an OpenAI-compatible Batch API on the slack of live vLLM servers."""


for module in (config_cmd, db, engine, flower, keys, report, serve, storage, up, watch, worker):
    for command in module.COMMANDS:
        main.add_command(command)

__all__ = ["PLUGIN_GROUP", "main"]
