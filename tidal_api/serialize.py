"""Store rows -> OpenAI wire objects. The only place that knows the wire field names."""

from __future__ import annotations

import typing as t

from config import Settings
from tidal_workers.policy.phase import storage_usd
from tidal_workers.policy.pricing import Usage
from tidal_workers.policy.pricing import cost
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File

_BATCH_TIMES = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def file_object(f: File) -> dict[str, t.Any]:
    return {
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": f.created_at,
        "expires_at": f.expires_at,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": f.status,
        "status_details": None,
    }


def file_deleted(file_id: str) -> dict[str, t.Any]:
    return {"id": file_id, "object": "file", "deleted": True}


def batch_usage(b: Batch) -> Usage:
    """The batch's billed usage: the sum over its completed items, kept on the row by ``result.record``."""
    return Usage(
        input_tokens=b.input_tokens,
        cached_tokens=b.cached_tokens,
        output_tokens=b.output_tokens,
        reasoning_tokens=b.reasoning_tokens,
    )


def batch_cost(b: Batch, settings: Settings) -> dict[str, float]:
    """What the batch's billed usage (completed items only) costs at the batch price, and what it saved."""
    c = cost(batch_usage(b), b.model or "*", settings.price_table, settings.batch_discount)
    # Nano-dollars: a few tokens still show, float noise does not.
    return {
        "batch_usd": round(c.batch_usd, 9),
        "online_usd": round(c.online_usd, 9),
        "saved_usd": round(c.saved_usd, 9),
    }


def model_served(b: Batch, served: t.AbstractSet[str] | None) -> bool | None:
    """For a batch in progress: whether a live node's engine serves its model (else its items wait, queued, and the
    batch does not fail while its window is open). None for other statuses, or when Redis could not say."""
    if b.status != BatchStatus.in_progress.value or served is None:
        return None
    return (b.model or "") in served


def batch_object(b: Batch, settings: Settings, served: t.AbstractSet[str] | None) -> dict[str, t.Any]:
    """``served``: the models live nodes serve now (``Queue.served_models``), or None if unknown."""
    return {
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "model": b.model,
        "errors": {"object": "list", "data": b.errors} if b.errors else None,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        **{name: getattr(b, name) for name in _BATCH_TIMES},
        "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed},
        "metadata": b.metadata_,
        "usage": batch_usage(b).as_batch_usage(),
        # Tidal's extension: where the batch stands against its window (written by the re-score sweep),
        # whether any node can run it now, and what it costs so far.
        "tidal": {
            "priority": b.priority,
            "laxity_seconds": b.laxity_seconds,
            "observed_rate": b.observed_rate,
            "model_served": model_served(b, served),
            "cost": batch_cost(b, settings),
            "phase_split": b.phase_split,
            "kv_stored_bytes": b.kv_stored_bytes,
            "kv_storage_usd": round(storage_usd(b.kv_byte_seconds, settings.kv_storage_usd_per_gib_hour), 9),
        },
    }
