"""The frozen KV of split items on disk: measured per batch, billed over time, deleted when the batch ends.

TidalFreezeConnector (tidal_engine.freeze) writes a batch's frozen KV under ``<TIDAL_KV_FREEZE_DIR>/<batch id>/``,
a folder every node mounts. Beat's retention sweep calls :func:`sweep`: for each batch folder it sets the batch's
``kv_stored_bytes`` to the folder's size and adds the bytes held since the last pass to ``kv_byte_seconds``
(what ``tidal report`` bills); a folder whose batch has ended (or that names no batch) is deleted. A decode phase
whose KV was deleted is recomputed by the engine: never an error.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy import update

from tidal_workers.runtime import Runtime
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus

log = logging.getLogger(__name__)

OPEN = (BatchStatus.validating.value, BatchStatus.in_progress.value, BatchStatus.finalizing.value)


@dataclasses.dataclass
class FrozenReport:
    held_bytes: int = 0  # frozen KV of open batches after the pass
    deleted: list[str] = dataclasses.field(default_factory=list)  # batch folders removed
    freed_bytes: int = 0


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def sweep(rt: Runtime, now: float | None = None) -> FrozenReport:
    """One accounting pass over the freeze folder (idempotent apart from the time it bills)."""
    report = FrozenReport()
    root = rt.settings.kv_freeze_dir
    if not root or not Path(root).is_dir():
        return report
    at = time.time() if now is None else now
    folders = {p.name: p for p in Path(root).iterdir() if p.is_dir()}
    with rt.store.transaction() as s:
        rows = {
            r.id: r
            for r in s.execute(
                select(Batch.id, Batch.status, Batch.kv_stored_bytes, Batch.kv_accounted_at).where(
                    Batch.id.in_(folders) | (Batch.kv_stored_bytes > 0)
                )
            )
        }
        for batch_id, row in rows.items():
            held = folder_bytes(folders[batch_id]) if batch_id in folders and row.status in OPEN else 0
            since = row.kv_accounted_at if row.kv_accounted_at is not None else at
            s.execute(
                update(Batch)
                .where(Batch.id == batch_id)
                .values(
                    kv_stored_bytes=held,
                    kv_byte_seconds=Batch.kv_byte_seconds + row.kv_stored_bytes * max(0.0, at - since),
                    kv_accounted_at=at if held else None,
                )
            )
            report.held_bytes += held
    for name, folder in folders.items():
        status = rows[name].status if name in rows else None
        if status not in OPEN:
            report.freed_bytes += folder_bytes(folder)
            shutil.rmtree(folder, ignore_errors=True)
            report.deleted.append(name)
    if report.deleted:
        log.info("frozen KV: %d batch folders deleted (%d bytes)", len(report.deleted), report.freed_bytes)
    return report
