"""`tidal config`: show the effective settings, or print docs/configuration.md's table."""
import dataclasses

import click

from config import load_settings
from config.settings import documented_fields, env_name

SECRET_FIELDS = {"api_keys", "flower_basic_auth"}


@click.group("config")
def config_group() -> None:
    """Settings (TIDAL_* environment variables)."""


@config_group.command()
def show() -> None:
    """Print every effective setting, secrets masked."""
    settings = load_settings()
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.name in SECRET_FIELDS and value:
            value = "***"
        click.echo(f"{env_name(f.name)}={value}")


@config_group.command()
def table() -> None:
    """Print the Markdown table of every setting (the body of docs/configuration.md)."""
    click.echo("| variable | default | meaning |\n| --- | --- | --- |")
    for name, default, doc in documented_fields():
        click.echo(f"| `{name}` | `{default}` | {doc} |")


COMMANDS = [config_group]
