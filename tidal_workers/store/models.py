"""Tables. Times are integer Unix seconds, as on OpenAI's wire."""

from __future__ import annotations

import enum
import secrets
import typing as t

from sqlalchemy import JSON
from sqlalchemy import BigInteger
from sqlalchemy import Boolean
from sqlalchemy import ForeignKey
from sqlalchemy import Index
from sqlalchemy import Integer
from sqlalchemy import String
from sqlalchemy import Text
from sqlalchemy import UniqueConstraint
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import Mapped
from sqlalchemy.orm import mapped_column
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal


class Base(DeclarativeBase):
    pass


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


LIST_SEQUENCE = "tidal_list_seq"  # PostgreSQL's sequence behind files.seq and batches.seq


class NextSeq(ColumnElement[int]):
    """The next list-order number of a table, computed by the database inside the INSERT itself.

    PostgreSQL takes it from a sequence; SQLite, whose single writer holds the lock for the whole INSERT, from the
    table's largest ``seq`` plus one. Either way rows created in the same second get distinct, increasing numbers,
    which ``created_at`` (whole seconds) cannot give.
    """

    inherit_cache = True
    _traverse_internals = [("table", InternalTraversal.dp_string)]  # noqa: RUF012 (SQLAlchemy's own declaration)
    type = BigInteger()

    def __init__(self, table: str):
        self.table = table


@compiles(NextSeq, "postgresql")
def _next_seq_postgresql(element: NextSeq, compiler: t.Any, **kw: t.Any) -> str:
    return f"nextval('{LIST_SEQUENCE}')"


@compiles(NextSeq)
def _next_seq_default(element: NextSeq, compiler: t.Any, **kw: t.Any) -> str:
    return f"(SELECT coalesce(max(seq), 0) + 1 FROM {element.table})"


class BatchStatus(str, enum.Enum):
    validating = "validating"
    failed = "failed"
    in_progress = "in_progress"
    finalizing = "finalizing"
    completed = "completed"
    expired = "expired"
    cancelling = "cancelling"
    cancelled = "cancelled"


class ItemStatus(str, enum.Enum):
    pending = "pending"  # queued or in flight: only a terminal write changes it
    completed = "completed"  # engine answered 2xx: an output-file line
    failed = "failed"  # engine 4xx or retry budget spent: an error-file line
    cancelled = "cancelled"  # batch cancelled before it ran: batch_cancelled line
    expired = "expired"  # window ran out before it ran: batch_expired line


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class KeySource(str, enum.Enum):
    config = "config"  # TIDAL_API_KEYS: revoked when it leaves the setting
    cli = "cli"  # `tidal keys create`: lives until `tidal keys revoke`
    dev = "dev"  # the public dev key: present only in dev mode


class ApiKey(Base):
    __tablename__ = "api_keys"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex; the key itself is never kept
    id: Mapped[str] = mapped_column(String(32), default=lambda: new_id("key_")[:20])  # what `tidal keys` names
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    hint: Mapped[str] = mapped_column(String(16), default="")  # `sk-...wxyz`: enough to recognise, not to use
    source: Mapped[str] = mapped_column(String(16), default=KeySource.config.value)
    created_at: Mapped[int] = mapped_column(BigInteger)
    last_used_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # kept to the minute
    revoked_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_api_keys_id", "id", unique=True),)


class File(Base):
    __tablename__ = "files"
    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("file-"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="processed")
    blob: Mapped[str] = mapped_column(String(128))  # name inside the blob directory
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)  # a tombstone: no bytes, kept for cursors
    seq: Mapped[int] = mapped_column(BigInteger, default=NextSeq("files"))  # list order (creation order)

    __table_args__ = (
        Index("ix_files_tenant_created", "tenant_id", "created_at", "id"),
        Index("ix_files_tenant_seq", "tenant_id", "seq"),
        Index("ix_files_seq", "seq"),
        Index("ix_files_expires_at", "expires_at"),
    )
    __mapper_args__ = {"eager_defaults": True}  # noqa: RUF012 (seq comes back with the INSERT: RETURNING)


class Batch(Base):
    __tablename__ = "batches"
    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=lambda: new_id("batch_"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    endpoint: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    input_file_id: Mapped[str] = mapped_column(String(64))  # no foreign key: an expired input file's row goes
    completion_window: Mapped[str] = mapped_column(String(8), default="24h")
    status: Mapped[str] = mapped_column(String(16), default=BatchStatus.validating.value, index=True)
    output_file_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    errors: Mapped[list | None] = mapped_column(JSON, nullable=True)  # validation errors.data
    metadata_: Mapped[dict | None] = mapped_column("metadata", JSON, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    in_progress_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    finalizing_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    completed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    failed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expired_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cancelling_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cancelled_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # request_counts, kept live in the same transaction as each item's terminal write
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    # usage of completed items (the billed ones)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # SLA state written by the re-score sweep (the `tidal` extension object)
    priority: Mapped[int] = mapped_column(Integer, default=100)
    laxity_seconds: Mapped[float | None] = mapped_column(nullable=True)
    observed_rate: Mapped[float | None] = mapped_column(nullable=True)
    # ingest's attempts, counted before each one starts (so one whose process dies counts), and when the running
    # one began (NULL when none runs: not started yet, or the last one raised)
    ingest_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ingest_started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # attempts at writing its files once finalizing, counted before each one starts (so one whose process dies
    # counts): at TIDAL_FINALIZE_ATTEMPTS the batch fails with `finalize_failed` (finalize.py)
    finalize_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # quotas and retention
    enqueued_tokens: Mapped[int] = mapped_column(BigInteger, default=0)  # estimate, counted while unfinished
    output_expires_after: Mapped[int | None] = mapped_column(Integer, nullable=True)  # seconds, for its files
    # phase-split freeze / thaw (tidal_workers.policy.phase): the batch's split mode, the frozen KV it holds now, and that
    # size integrated over time (what storage_usd bills)
    phase_split: Mapped[str] = mapped_column(String(8), default="auto", server_default="never")
    kv_stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    kv_byte_seconds: Mapped[float] = mapped_column(default=0.0, server_default="0")
    kv_accounted_at: Mapped[float | None] = mapped_column(nullable=True)  # the last pass that found frozen KV
    seq: Mapped[int] = mapped_column(BigInteger, default=NextSeq("batches"))  # list order (creation order)

    __table_args__ = (
        Index("ix_batches_tenant_created", "tenant_id", "created_at", "id"),
        Index("ix_batches_tenant_seq", "tenant_id", "seq"),
        Index("ix_batches_seq", "seq"),
    )
    __mapper_args__ = {"eager_defaults": True}  # noqa: RUF012 (seq comes back with the INSERT: RETURNING)


class Item(Base):
    """One request line of a batch's input file."""

    __tablename__ = "items"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id"))
    line: Mapped[int] = mapped_column(Integer)  # 1-based line in the input file
    ordinal: Mapped[int] = mapped_column(Integer)  # claim order inside the batch (prefix groups)
    custom_id: Mapped[str] = mapped_column(String(512))
    url: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)  # the request body as JSON text
    status: Mapped[str] = mapped_column(String(16), default=ItemStatus.pending.value)
    # The phase split (tidal_workers.policy.phase.Phase): what the item's next run is. `whole`, or `prefill` for an item
    # split at ingest, which becomes `decode` once its prefill has answered.
    phase: Mapped[str] = mapped_column(String(8), default="whole", server_default="whole")
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # attempt whose result was written
    # Times the engine died while this item's request was at it (``poison.py``): at TIDAL_ENGINE_CRASH_LIMIT the
    # item is an `engine_crash` error line, not handed back once more.
    engine_deaths: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Times its lease expired and was reclaimed (``reclaim.py``: its worker died): at TIDAL_RECLAIM_LIMIT the item
    # is a `worker_lost` error line, not queued once more.
    reclaims: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    response_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    response_body: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    reasoning_tokens: Mapped[int] = mapped_column(Integer, default=0)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (
        UniqueConstraint("batch_id", "custom_id", name="uq_items_batch_custom_id"),
        Index("ix_items_batch_status", "batch_id", "status"),
    )


class IdempotencyKey(Base):
    """A create (``POST /v1/files``, ``POST /v1/batches``) sent with an ``Idempotency-Key`` header: for 24 hours
    the same key and body answer the object it made; another body under the key is a conflict."""

    __tablename__ = "idempotency_keys"
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    route: Mapped[str] = mapped_column(String(32), primary_key=True)  # "files" or "batches"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))  # sha256 of what the request asked for
    object_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[int] = mapped_column(BigInteger, index=True)
