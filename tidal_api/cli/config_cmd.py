"""`tidal config`: show the effective settings, or print docs/configuration.md's table."""

import dataclasses
import typing as t

import click

from config import load_settings
from config.redact import MASK
from config.redact import redacted
from config.settings import documented_fields
from config.settings import env_name


@click.group("config")
def config_group() -> None:
    """Settings (TIDAL_* environment variables)."""


@config_group.command()
def show() -> None:
    """Print every effective setting, secrets masked."""
    settings = load_settings()
    for f in dataclasses.fields(settings):
        click.echo(f"{env_name(f.name)}={shown(f, getattr(settings, f.name))}")


def shown(f: dataclasses.Field[t.Any], value: t.Any) -> t.Any:
    """A setting as `config show` prints it: secrets (``secret`` metadata) masked, and any URL's password."""
    if f.metadata.get("secret") and value:
        return MASK
    if isinstance(value, str) and "://" in value:
        return redacted(value)
    return value


BEGIN, END = "<!-- tidal config table: begin -->\n", "<!-- tidal config table: end -->"


def markdown_table() -> str:
    rows = [f"| `{name}` | `{default}` | {accepts} | {doc} |" for name, default, accepts, doc in documented_fields()]
    return "\n".join(["| variable | default | accepts | meaning |", "| --- | --- | --- | --- |", *rows]) + "\n"


@config_group.command()
@click.option(
    "--write",
    "doc",
    type=click.Path(exists=True, dir_okay=False),
    help="Replace the table between the markers in this file (docs/configuration.md) instead.",
)
def table(doc: str | None) -> None:
    """Print the Markdown table of every setting (the body of docs/configuration.md)."""
    if doc is None:
        click.echo(markdown_table(), nl=False)
        return
    with open(doc) as f:
        text = f.read()
    head, found, rest = text.partition(BEGIN)
    _old, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise click.ClickException(f"{doc} lacks the markers {BEGIN.strip()} ... {END}")
    with open(doc, "w") as f:
        f.write(head + BEGIN + markdown_table() + END + tail)


COMMANDS = [config_group]
