"""`tidal report`: spend and savings of completed items, per batch and per day, in every format."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from click.testing import CliRunner

from tidal_api.cli import main
from tidal_workers import report
from tidal_workers.store import Batch
from tidal_workers.store import File
from tidal_workers.store import Item
from tidal_workers.store import ItemStatus

DAY1 = int(dt.datetime(2026, 11, 27, 12, tzinfo=dt.UTC).timestamp())
DAY2 = DAY1 + 86_400


@pytest.fixture
def billed(rt):
    """Two tenants' batches; completed items carry usage, failed ones must not be billed."""
    with rt.store.transaction() as s:
        for tenant in ("acme", "globex"):
            s.add(
                File(
                    id=f"file-{tenant}",
                    tenant_id=tenant,
                    filename="in.jsonl",
                    purpose="batch",
                    bytes=1,
                    created_at=DAY1,
                    blob="x",
                )
            )
        s.flush()
        s.add_all(
            [
                Batch(
                    id="batch_a",
                    tenant_id="acme",
                    endpoint="/v1/chat/completions",
                    model="tiny",
                    input_file_id="file-acme",
                    created_at=DAY1,
                    expires_at=DAY1 + 86_400,
                    status="completed",
                    phase_split="always",
                    kv_byte_seconds=3 * 1024**3 * 3600.0,  # 3 GiB-hours of frozen KV
                ),
                Batch(
                    id="batch_g",
                    tenant_id="globex",
                    endpoint="/v1/chat/completions",
                    model="big",
                    input_file_id="file-globex",
                    created_at=DAY1,
                    expires_at=DAY1 + 86_400,
                    status="completed",
                ),
            ]
        )
        s.flush()
        rows = [
            ("batch_a", ItemStatus.completed, 1000, 500, DAY1),
            ("batch_a", ItemStatus.completed, 1000, 500, DAY2),
            ("batch_a", ItemStatus.failed, 9999, 9999, DAY2),
            ("batch_g", ItemStatus.completed, 2000, 0, DAY2),
        ]
        for i, (batch, status, inp, out, at) in enumerate(rows):
            s.add(
                Item(
                    batch_id=batch,
                    line=i + 1,
                    ordinal=i,
                    custom_id=f"c{i}",
                    url="/v1/chat/completions",
                    body="{}",
                    status=status.value,
                    input_tokens=inp,
                    output_tokens=out,
                    finished_at=at,
                )
            )
    return rt.settings.replace(prices='{"*": [1.0, 2.0], "big": [10.0, 20.0]}', batch_discount=0.5)


def test_per_batch_bills_completed_items_at_the_discount(rt, billed):
    rows = {r.key: r for r in report.per_batch(rt.store, billed, report.Filters())}
    a = rows["batch_a"]
    assert (a.items, a.usage.input_tokens, a.usage.output_tokens) == (2, 2000, 1000)
    assert a.cost.online_usd == pytest.approx((2000 * 1.0 + 1000 * 2.0) / 1e6)
    assert a.cost.batch_usd == pytest.approx(a.cost.online_usd / 2)
    assert rows["batch_g"].cost.online_usd == pytest.approx(2000 * 10.0 / 1e6)  # the model's own price row
    assert a.storage_usd == pytest.approx(3 * billed.kv_storage_usd_per_gib_hour)  # A-P's frozen KV
    assert rows["batch_g"].storage_usd == 0
    assert report.total(list(rows.values())).storage_usd == pytest.approx(a.storage_usd)


def test_per_day_and_filters(rt, billed):
    days = report.per_day(rt.store, billed, report.Filters())
    assert sorted((r.key, r.model, r.items) for r in days) == [
        ("2026-11-27", "tiny", 1),
        ("2026-11-28", "big", 1),
        ("2026-11-28", "tiny", 1),
    ]
    only = report.per_day(rt.store, billed, report.Filters(tenant="acme", since=dt.date(2026, 11, 28)))
    assert [(r.key, r.items) for r in only] == [("2026-11-28", 1)]
    assert report.per_batch(rt.store, billed, report.Filters(model="big"))[0].key == "batch_g"


def _run(rt, *args):
    env = {
        "TIDAL_HOME": rt.settings.home,
        "TIDAL_DATABASE_URL": rt.settings.database_url,
        "TIDAL_PRICES": '{"*": [1.0, 2.0], "big": [10.0, 20.0]}',
        "TIDAL_ENV": "dev",
        "TIDAL_API_KEYS": rt.settings.api_keys,
    }
    result = CliRunner().invoke(main, ["report", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_cli_formats_and_chart(rt, billed, tmp_path):
    data = json.loads(_run(rt, "--format", "json"))
    assert data[-1]["key"] == "total" and data[-1]["items"] == 3
    assert data[-1]["saved_usd"] == pytest.approx(data[-1]["online_usd"] / 2)
    rows = list(csv.DictReader(io.StringIO(_run(rt, "--by", "day", "--format", "csv"))))
    assert {r["key"] for r in rows} == {"2026-11-27", "2026-11-28", "total"}
    table = _run(rt, "--key", "globex-key")
    assert "batch_g" in table and "batch_a" not in table
    chart = tmp_path / "spend.png"
    _run(rt, "--by", "day", "--chart", str(chart))
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
