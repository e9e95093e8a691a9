"""A-P's frozen KV on disk (tidal_workers.frozen): measured per batch, billed over time, deleted at the batch's end.

The folders are what TidalFreezeConnector writes (``<dir>/<batch id>/<prompt hash>/<layer>.safetensors``,
tests/e2e/test_freeze_thaw.py runs it); here they are written directly, on a scripted clock.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

from tidal_workers import frozen
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus

T0 = 1_800_000_000.0
LAYER = "model.layers.0.self_attn.attn.safetensors"


def _batch(rt, batch_id, status=BatchStatus.in_progress):
    with rt.store.transaction() as s:
        s.add(
            Batch(
                id=batch_id,
                tenant_id="acme",
                endpoint="/v1/completions",
                input_file_id="file-x",
                created_at=int(T0),
                expires_at=int(T0) + 86_400,
                status=status.value,
                phase_split="always",
            )
        )


def _freeze(root, batch_id, prompt_hash, size):
    folder = root / batch_id / prompt_hash
    folder.mkdir(parents=True)
    (folder / LAYER).write_bytes(b"\0" * size)


def _row(rt, batch_id):
    with rt.store.read() as s:
        return s.get_one(Batch, batch_id)


@pytest.fixture
def kv_rt(rt, tmp_path):
    rt.settings = rt.settings.replace(kv_freeze_dir=str(tmp_path / "kv"))
    (tmp_path / "kv").mkdir()
    return rt


def test_open_batches_are_measured_and_billed_over_time(kv_rt, tmp_path):
    root = tmp_path / "kv"
    _batch(kv_rt, "batch_a")
    _freeze(root, "batch_a", "p1", 3000)
    _freeze(root, "batch_a", "p2", 1000)

    first = frozen.sweep(kv_rt, T0)
    assert first.held_bytes == 4000 and first.deleted == []
    row = _row(kv_rt, "batch_a")
    assert (row.kv_stored_bytes, row.kv_byte_seconds, row.kv_accounted_at) == (4000, 0.0, T0)

    _freeze(root, "batch_a", "p3", 2000)  # a third prefill froze since
    frozen.sweep(kv_rt, T0 + 100)
    row = _row(kv_rt, "batch_a")
    assert row.kv_stored_bytes == 6000
    assert row.kv_byte_seconds == pytest.approx(4000 * 100)  # what it held over the interval
    assert (root / "batch_a" / "p3").is_dir()  # an open batch keeps its KV


def test_an_ended_batch_is_billed_to_its_end_and_its_kv_deleted(kv_rt, tmp_path):
    root = tmp_path / "kv"
    _batch(kv_rt, "batch_a")
    _freeze(root, "batch_a", "p1", 5000)
    frozen.sweep(kv_rt, T0)
    with kv_rt.store.transaction() as s:
        s.execute(update(Batch).where(Batch.id == "batch_a").values(status=BatchStatus.expired.value))

    report = frozen.sweep(kv_rt, T0 + 60)
    assert report.deleted == ["batch_a"] and report.freed_bytes == 5000 and report.held_bytes == 0
    assert not (root / "batch_a").exists()
    row = _row(kv_rt, "batch_a")
    assert (row.kv_stored_bytes, row.kv_accounted_at) == (0, None)
    assert row.kv_byte_seconds == pytest.approx(5000 * 60)

    again = frozen.sweep(kv_rt, T0 + 120)  # idempotent: nothing more to bill or delete
    assert again.deleted == [] and _row(kv_rt, "batch_a").kv_byte_seconds == pytest.approx(5000 * 60)


def test_a_folder_that_names_no_batch_is_deleted(kv_rt, tmp_path):
    root = tmp_path / "kv"
    _freeze(root, "batch_gone", "p1", 10)
    assert frozen.sweep(kv_rt, T0).deleted == ["batch_gone"]
    assert list(root.iterdir()) == []


def test_off_without_a_freeze_dir(rt):
    assert rt.settings.kv_freeze_dir == ""
    assert frozen.sweep(rt, T0) == frozen.FrozenReport()
