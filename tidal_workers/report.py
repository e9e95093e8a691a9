"""Spend and savings per batch and per day, from the store (what `tidal report` prints).

Only completed items are billed, so both views sum completed items' usage;
a day is the UTC day an item finished. The per-batch view also bills the
frozen KV a batch held (the phase split), as stored byte-seconds at a price per GiB-hour.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import typing as t

from sqlalchemy import Select
from sqlalchemy import func
from sqlalchemy import select

from config import Settings
from tidal_workers.policy.phase import storage_usd
from tidal_workers.policy.pricing import Cost
from tidal_workers.policy.pricing import Usage
from tidal_workers.policy.pricing import cost
from tidal_workers.store import Batch
from tidal_workers.store import Item
from tidal_workers.store import ItemStatus
from tidal_workers.store import Store

DAY = 86_400


@dataclasses.dataclass(frozen=True)
class Filters:
    tenant: str | None = None
    model: str | None = None
    since: dt.date | None = None  # inclusive, UTC
    until: dt.date | None = None  # inclusive, UTC

    def bounds(self) -> tuple[int | None, int | None]:
        lo = int(dt.datetime.combine(self.since, dt.time(), dt.UTC).timestamp()) if self.since else None
        hi = int(dt.datetime.combine(self.until, dt.time(), dt.UTC).timestamp()) + DAY if self.until else None
        return lo, hi


@dataclasses.dataclass(frozen=True)
class Row:
    key: str  # batch id, or the day as YYYY-MM-DD
    model: str
    items: int
    usage: Usage
    cost: Cost
    storage_usd: float = 0.0  # holding the batch's frozen KV (the phase split); per batch only, 0 in the per-day view

    def as_dict(self) -> dict[str, t.Any]:
        return {
            "key": self.key,
            "model": self.model,
            "items": self.items,
            "input_tokens": self.usage.input_tokens,
            "cached_tokens": self.usage.cached_tokens,
            "output_tokens": self.usage.output_tokens,
            "total_tokens": self.usage.total_tokens,
            "online_usd": round(self.cost.online_usd, 6),
            "batch_usd": round(self.cost.batch_usd, 6),
            "saved_usd": round(self.cost.saved_usd, 6),
            "storage_usd": round(self.storage_usd, 6),
        }


def _completed_items(filters: Filters) -> Select[int, int, int, int, int]:
    q = (
        select(
            func.count(Item.id),
            func.coalesce(func.sum(Item.input_tokens), 0),
            func.coalesce(func.sum(Item.cached_tokens), 0),
            func.coalesce(func.sum(Item.output_tokens), 0),
            func.coalesce(func.sum(Item.reasoning_tokens), 0),
        )
        .join(Batch, Batch.id == Item.batch_id)
        .where(Item.status == ItemStatus.completed.value)
    )
    lo, hi = filters.bounds()
    if lo is not None:
        q = q.where(Item.finished_at >= lo)
    if hi is not None:
        q = q.where(Item.finished_at < hi)
    if filters.tenant:
        q = q.where(Batch.tenant_id == filters.tenant)
    if filters.model:
        q = q.where(Batch.model == filters.model)
    return q


def _row(key: str, model: str | None, agg: t.Sequence[int], settings: Settings, byte_seconds: float = 0.0) -> Row:
    usage = Usage(
        input_tokens=int(agg[1]), cached_tokens=int(agg[2]), output_tokens=int(agg[3]), reasoning_tokens=int(agg[4])
    )
    model = model or "*"
    spent = cost(usage, model, settings.price_table, settings.batch_discount)
    return Row(key, model, int(agg[0]), usage, spent, storage_usd(byte_seconds, settings.kv_storage_usd_per_gib_hour))


def per_batch(store: Store, settings: Settings, filters: Filters) -> list[Row]:
    columns = (Batch.id, Batch.model, Batch.kv_byte_seconds)
    q = _completed_items(filters).add_columns(*columns).group_by(*columns).order_by(Batch.id)
    with store.read() as s:
        return [_row(r[5], r[6], r, settings, r[7]) for r in s.execute(q)]


def per_day(store: Store, settings: Settings, filters: Filters) -> list[Row]:
    day = (Item.finished_at / DAY).label("day")  # integer division on SQLite and PostgreSQL alike
    q = _completed_items(filters).add_columns(day, Batch.model).group_by(day, Batch.model).order_by(day)
    with store.read() as s:
        rows = []
        for r in s.execute(q):
            date = dt.datetime.fromtimestamp(int(r[5]) * DAY, dt.UTC).date().isoformat()
            rows.append(_row(date, r[6], r, settings))
        return rows


def total(rows: list[Row]) -> Row:
    usage, spent = Usage(), Cost()
    for row in rows:
        usage, spent = usage + row.usage, spent + row.cost
    return Row("total", "", sum(r.items for r in rows), usage, spent, sum(r.storage_usd for r in rows))


def chart(rows: list[Row], path: str) -> None:
    """Daily batch spend (bars) and harvested tokens (line), one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days: dict[str, tuple[float, int]] = {}
    for r in rows:
        usd, tokens = days.get(r.key, (0.0, 0))
        days[r.key] = (usd + r.cost.batch_usd, tokens + r.usage.total_tokens)
    labels = list(days)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(labels, [v[0] for v in days.values()], color="#3b7dd8", label="batch spend (USD)")
    ax.set_ylabel("USD")
    ax2 = ax.twinx()
    ax2.plot(labels, [v[1] for v in days.values()], color="#d8733b", marker="o", label="harvested tokens")
    ax2.set_ylabel("tokens")
    ax.set_title("Daily batch spend and harvested tokens")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
