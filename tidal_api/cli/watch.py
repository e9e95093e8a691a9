"""`tidal batches watch ID`: a live progress bar with rate and ETA, then the final status and cost.

The rate is the same estimator the laxity re-score uses, fed from the batch's
request_counts as this command polls them.
"""

from __future__ import annotations

import time

import click
import requests

from config import load_settings
from tidal_workers.policy.laxity import RateEstimator

FINAL = ("completed", "failed", "expired", "cancelled")


def _eta(remaining: int, rate: float | None) -> str:
    if rate is None:
        return "--:--"
    if rate <= 0:
        return "stalled"
    secs = int(remaining / rate)
    return f"{secs // 3600:d}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def progress_line(batch: dict, rate: float | None, width: int = 30) -> str:
    counts = batch.get("request_counts") or {}
    total, done = counts.get("total") or 0, (counts.get("completed") or 0) + (counts.get("failed") or 0)
    filled = int(width * done / total) if total else 0
    rate_s = f"{rate:7.2f}/s" if rate is not None else "   -- /s"
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {batch['status']:<11} "
        f"{rate_s} eta {_eta(total - done, rate)}"
    )


def follow(http: requests.Session, base_url: str, batch_id: str, interval: float = 1.0) -> dict:
    """Poll until the batch is final, redrawing one progress line; returns the final batch."""
    estimator = RateEstimator(tau=30.0)
    while True:
        resp = http.get(f"{base_url}/v1/batches/{batch_id}", timeout=30)
        resp.raise_for_status()
        batch = resp.json()
        counts = batch.get("request_counts") or {}
        estimator = estimator.observe(time.monotonic(), (counts.get("completed") or 0) + (counts.get("failed") or 0))
        click.echo("\r" + progress_line(batch, estimator.rate), nl=False)
        if batch["status"] in FINAL:
            click.echo()
            click.echo(final_summary(batch))
            return batch
        time.sleep(interval)


def final_summary(batch: dict) -> str:
    counts = batch.get("request_counts") or {}
    usage = batch.get("usage") or {}
    cost = (batch.get("tidal") or {}).get("cost") or {}
    line = (
        f"{batch['id']} {batch['status']}: {counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed; "
        f"{usage.get('total_tokens', 0)} tokens"
    )
    if cost:
        line += f"; billed ${cost['batch_usd']:.6f} (online ${cost['online_usd']:.6f}, saved ${cost['saved_usd']:.6f})"
    return line


@click.group()
def batches() -> None:
    """Batches, from the command line."""


@batches.command()
@click.argument("batch_id")
@click.option("--url", default=None, help="Tidal's base URL; default http://TIDAL_BIND.")
@click.option("--key", default=None, help="API key; default the first configured key.")
@click.option("--interval", default=1.0, show_default=True)
def watch(batch_id: str, url: str | None, key: str | None, interval: float) -> None:
    """Follow a batch to its end with a live progress bar."""
    settings = load_settings()
    keys = settings.configured_keys
    if key is None and not keys:
        raise click.UsageError("pass --key (no TIDAL_API_KEYS configured)")
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {key or keys[0][1]}"
    follow(http, url or f"http://{settings.bind}", batch_id, interval)


COMMANDS = [batches]
