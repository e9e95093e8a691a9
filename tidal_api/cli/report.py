"""`tidal report`: batch spend and savings against the online price."""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys

import click

from config import load_settings


def _date(_ctx: click.Context, _param: click.Parameter, value: str | None) -> dt.date | None:
    return dt.date.fromisoformat(value) if value else None


@click.command()
@click.option("--by", type=click.Choice(["batch", "day"]), default="batch", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--tenant", help="Only this tenant's batches.")
@click.option("--key", help="Only the batches of this API key's tenant.")
@click.option("--model", help="Only batches of this model.")
@click.option("--since", callback=_date, help="First UTC day, YYYY-MM-DD.")
@click.option("--until", callback=_date, help="Last UTC day, YYYY-MM-DD.")
@click.option("--chart", type=click.Path(dir_okay=False), help="Also write a PNG of daily spend and harvested tokens.")
def report(
    by: str,
    fmt: str,
    tenant: str | None,
    key: str | None,
    model: str | None,
    since: dt.date | None,
    until: dt.date | None,
    chart: str | None,
) -> None:
    """Per-batch or per-day cost of completed items, and the savings against the online price."""
    from tidal_workers import report as rep
    from tidal_workers.store import Store
    from tidal_workers.store import api_keys

    settings = load_settings()
    store = Store(settings)
    if key:
        tenant = api_keys.tenant_for_key(store, key)
        if tenant is None:
            raise click.BadParameter("unknown API key", param_hint="--key")
    filters = rep.Filters(tenant=tenant, model=model, since=since, until=until)
    rows = rep.per_batch(store, settings, filters) if by == "batch" else rep.per_day(store, settings, filters)
    if chart:
        rep.chart(rows if by == "day" else rep.per_day(store, settings, filters), chart)
    dicts = [r.as_dict() for r in rows] + [rep.total(rows).as_dict()]
    if fmt == "json":
        click.echo(json.dumps(dicts, indent=2))
    elif fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=list(dicts[0]))
        writer.writeheader()
        writer.writerows(dicts)
    else:
        header = f"{by:<34} {'model':<14} {'items':>7} {'tokens':>12} {'batch $':>11} {'online $':>11} {'saved $':>11} {'storage $':>11}"
        click.echo(header)
        click.echo("-" * len(header))
        for d in dicts:
            click.echo(
                f"{d['key']:<34} {d['model']:<14} {d['items']:>7} {d['total_tokens']:>12} "
                f"{d['batch_usd']:>11.4f} {d['online_usd']:>11.4f} {d['saved_usd']:>11.4f} {d['storage_usd']:>11.4f}"
            )
    if chart:
        click.echo(f"chart written to {chart}", err=True)


COMMANDS = [report]
