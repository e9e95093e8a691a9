"""Every Tidal setting, read once from ``TIDAL_*`` environment variables.

Nothing else in Tidal reads ``os.environ``: code receives a :class:`Settings`
(usually from :func:`load_settings`) and tests build one with overrides.
Each field's ``doc`` metadata is the single description of that setting;
``docs/configuration.md`` is checked against it by a test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import typing as t
from pathlib import Path

PREFIX = "TIDAL_"


def _setting(default: t.Any, doc: str, **kw: t.Any) -> t.Any:
    if callable(default) and not isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata={"doc": doc, **kw})
    return dataclasses.field(default=default, metadata={"doc": doc, **kw})


@dataclasses.dataclass(frozen=True)
class Settings:
    # --- where things live -------------------------------------------------
    env: str = _setting(
        "prod", "`dev` enables the built-in key `tidal-dev-key` (tenant `dev`); anything else is production."
    )
    home: str = _setting(
        lambda: str(Path.home() / ".tidal"),
        "Directory for the SQLite database, file blobs, the tiny model and local processes.",
    )
    database_url: str = _setting(
        "",
        "SQLAlchemy URL of the store. Empty: SQLite (WAL mode) at `$TIDAL_HOME/tidal.db`. Example: `postgresql+psycopg2://user@host/db`.",
    )
    blob_dir: str = _setting("", "Directory holding file bytes (`TIDAL_STORAGE=local`). Empty: `$TIDAL_HOME/blobs`.")
    storage: str = _setting(
        "local",
        "Where file bytes live: `local` (the directory `TIDAL_BLOB_DIR`: one host, or one directory every host mounts) or `s3` (S3-compatible object storage, `TIDAL_S3_*`, the `s3` extra). Every process checks at start that it sees the same storage as the rest of the fleet.",
    )
    s3_bucket: str = _setting("", "`TIDAL_STORAGE=s3`: the bucket (created beforehand; Tidal never creates it).")
    s3_prefix: str = _setting("tidal/", "`TIDAL_STORAGE=s3`: key prefix of every object Tidal writes in the bucket.")
    s3_endpoint_url: str = _setting(
        "",
        "`TIDAL_STORAGE=s3`: URL of an S3-compatible service (MinIO, Ceph RGW, ...; path-style addressing). Empty: AWS S3.",
    )
    s3_region: str = _setting("us-east-1", "`TIDAL_STORAGE=s3`: the bucket's region.")
    s3_access_key_id: str = _setting(
        "",
        "`TIDAL_STORAGE=s3`: access key. Empty: boto3's default credential chain (AWS_* variables, ~/.aws, an instance role).",
    )
    s3_secret_access_key: str = _setting("", "`TIDAL_STORAGE=s3`: secret key, with `TIDAL_S3_ACCESS_KEY_ID`.")
    s3_part_bytes: int = _setting(
        8 * 1024 * 1024,
        "`TIDAL_STORAGE=s3`: part size of multipart uploads (at least S3's 5 MiB); each upload holds one part in memory.",
    )
    redis_url: str = _setting(
        "redis://127.0.0.1:6379/0", "Redis for the item queue, leases and beat's lock. Holds only what SQL can rebuild."
    )
    broker_url: str = _setting("", "Celery broker URL. Empty: the same as `TIDAL_REDIS_URL`.")
    vllm_url: str = _setting(
        "http://127.0.0.1:8000", "The co-located vLLM server this worker feeds (OpenAI API and /metrics)."
    )

    # --- the API -----------------------------------------------------------
    api_keys: str = _setting(
        "", "Configured API keys as `tenant:key` pairs separated by commas. Stored hashed (SHA-256) at start-up."
    )
    bind: str = _setting("127.0.0.1:8080", "Address gunicorn binds for `tidal serve`.")
    api_workers: int = _setting(2, "gunicorn worker processes for the API.")
    api_threads: int = _setting(4, "Threads per gunicorn worker (gthread).")
    max_file_bytes: int = _setting(
        200 * 1024 * 1024, "Largest accepted upload for purpose `batch`, in bytes (OpenAI: 200 MB)."
    )
    max_upload_bytes: int = _setting(512 * 1024 * 1024, "Largest accepted upload of any purpose, in bytes.")
    max_file_lines: int = _setting(50_000, "Most request lines in a batch input file (OpenAI: 50,000).")
    models: str = _setting(
        "", "Comma-separated model names a batch may name; empty accepts any (then `model_not_found` never fires)."
    )
    sync_validate_bytes: int = _setting(
        1024 * 1024,
        "Input files up to this size are validated inside `POST /v1/batches`; larger ones by a Celery task.",
    )
    completion_window_seconds: int = _setting(
        86_400, "Real length of the completion window. The wire value stays `24h`; tests shorten this."
    )
    file_expiry_seconds: int = _setting(30 * 86_400, "Lifetime of uploaded and output files (`expires_at`).")

    # --- workers -----------------------------------------------------------
    node: str = _setting(
        lambda: socket.gethostname(), "Name of this GPU node; leases and in-flight counts are kept per node."
    )
    worker_threads: int = _setting(
        16, "Threads in the worker's pool (HTTP calls to vLLM); an upper bound on in-flight items."
    )
    max_inflight: int = _setting(
        4, "Upper bound of the AIMD gate's in-flight target (4 for the CPU engine, 64 on a GPU)."
    )
    min_inflight: int = _setting(0, "Lower bound of the gate; the fail-safe closes it to this.")
    initial_inflight: int = _setting(1, "Gate target when a worker starts.")
    lease_seconds: float = _setting(30.0, "Lease on a claimed item; renewed every third of it while the request runs.")
    claim_idle_seconds: float = _setting(
        0.1, "How long the claim loop sleeps when it claims nothing (a settled item on the node wakes it early)."
    )
    request_timeout_seconds: float = _setting(600.0, "Timeout of one HTTP request to vLLM.")
    retry_budget: int = _setting(
        8, "Transient failures (connection, 5xx, 429) an item may suffer before it is written as failed."
    )
    retry_backoff_seconds: float = _setting(0.5, "First retry delay; doubles each time, capped at 30 s.")
    worker_metrics_port: int = _setting(
        9187,
        "Port of the worker's Prometheus endpoint (gate target, queue depth by band, in-flight by node); 0 turns it off.",
    )

    # --- the AIMD gate ------------------------------------------------------
    gate_mode: str = _setting(
        "aimd",
        "`aimd`: the in-flight target follows the co-located vLLM's /metrics; `fixed`: it stays at `TIDAL_MAX_INFLIGHT`.",
    )
    scrape_seconds: float = _setting(1.0, "Period of the /metrics scrape and of the AIMD controller.")
    ewma_alpha: float = _setting(0.5, "Smoothing of KV usage and waiting counts (1 = no smoothing).")
    kv_high: float = _setting(0.85, "KV cache usage (EWMA) above which the target is halved.")
    kv_low: float = _setting(0.70, "KV cache usage (EWMA) below which the target grows by one per period.")
    online_waiting_tolerance: float = _setting(
        0.0, "Online requests waiting (EWMA) tolerated before the target is halved."
    )
    metrics_stale_seconds: float = _setting(5.0, "A reading older than this closes the gate (fail-safe).")

    # --- TidalScheduler (read inside vLLM's engine-core process) ----------
    sched_tbt_slo_ms: float = _setting(
        200.0, "TidalScheduler: online time-between-tokens SLO in ms; the step budget is this times (1 - guard)."
    )
    sched_guard: float = _setting(0.2, "TidalScheduler: fraction of the TBT SLO kept free as a safety margin.")
    sched_r2_min: float = _setting(
        0.85, "TidalScheduler: R² below which the latency model is not trusted and the static cap applies."
    )
    sched_static_cap_frac: float = _setting(
        0.25,
        "TidalScheduler: static batch cap as a fraction of max_num_batched_tokens, used while online traffic is present and the model is untrusted.",
    )
    sched_window: int = _setting(4000, "TidalScheduler: steps in the latency model's rolling least-squares window.")
    sched_h_min: float = _setting(0.05, "TidalScheduler: lower clamp of the KV guardband H.")
    sched_h_max: float = _setting(0.30, "TidalScheduler: upper clamp of the KV guardband H.")
    sched_h_alpha: float = _setting(
        0.05, "TidalScheduler: EWMA weight of each step's online KV demand in the guardband H."
    )
    sched_metrics_port: int = _setting(
        0, "TidalScheduler: port of its Prometheus endpoint in the engine-core process; 0 turns it off."
    )
    sched_metrics_host: str = _setting(
        "127.0.0.1",
        "TidalScheduler: address its Prometheus endpoint binds (`0.0.0.0` where Prometheus runs elsewhere).",
    )

    # --- SLA: laxity, escalation, floor ------------------------------------
    escalation_horizon_seconds: float = _setting(6 * 3600.0, "H: laxity below this starts raising a batch's priority.")
    batch_priority_min: int = _setting(1, "Most urgent priority a batch may reach (vLLM priority; lower is sooner).")
    sla_strict: bool = _setting(
        False, "Allow priority 0 (parity with online traffic) for a batch about to miss its window."
    )
    floor_urgency: float = _setting(
        0.9, "Urgency past which the token-bucket floor admits a batch even when the gate is closed."
    )
    rate_tau_seconds: float = _setting(
        900.0,
        "Time constant of a batch's observed-rate estimate: how fast its laxity (and ETA) follows a burst or a stall.",
    )
    floor_rate: float = _setting(
        0.5, "Guaranteed items per second per urgent batch per node, past the gate; 0 turns the floor off."
    )
    rescore_seconds: float = _setting(5.0, "Period of beat's laxity re-score.")
    reclaim_seconds: float = _setting(5.0, "Period of beat's expired-lease sweep.")
    expiry_seconds: float = _setting(30.0, "Period of beat's expiry sweep.")
    reconcile_seconds: float = _setting(60.0, "Period of beat's Redis-from-SQL reconcile.")
    ingest_resend_seconds: float = _setting(
        300.0,
        "Reconcile sends `tidal.ingest` again for a batch still `validating` this long after creation (the broker may have been down).",
    )
    beat_lock_seconds: int = _setting(20, "RedBeat lock timeout: how long a standby beat waits before taking over.")

    # --- pricing -----------------------------------------------------------
    prices: str = _setting(
        '{"*": [0.15, 0.60]}',
        "JSON: model -> [online USD per 1M input tokens, per 1M output tokens]; `*` is the default.",
    )
    batch_discount: float = _setting(0.5, "Batch price as a fraction of the online price.")

    # --- Flower ------------------------------------------------------------
    flower_port: int = _setting(5555, "Port of the Flower UI started by `tidal up --flower`.")
    flower_basic_auth: str = _setting("", "`user:password` for Flower; required by docker-compose.")

    # --- derived -----------------------------------------------------------
    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{Path(self.home) / 'tidal.db'}"

    @property
    def blob_path(self) -> Path:
        return Path(self.blob_dir) if self.blob_dir else Path(self.home) / "blobs"

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def sched_budget_seconds(self) -> float:
        """TidalScheduler's step budget: the TBT SLO less its guard."""
        return self.sched_tbt_slo_ms / 1000.0 * (1.0 - self.sched_guard)

    @property
    def model_list(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]

    @property
    def price_table(self) -> dict[str, tuple[float, float]]:
        return {k: (float(v[0]), float(v[1])) for k, v in json.loads(self.prices).items()}

    @property
    def configured_keys(self) -> list[tuple[str, str]]:
        """(tenant, key) pairs from TIDAL_API_KEYS, plus the dev key in dev mode."""
        pairs = []
        for chunk in self.api_keys.split(","):
            if chunk.strip():
                tenant, _, key = chunk.strip().partition(":")
                if not key:
                    raise ValueError("TIDAL_API_KEYS entries must look like tenant:key")
                pairs.append((tenant, key))
        if self.env == "dev":
            pairs.append(("dev", "tidal-dev-key"))
        return pairs

    def replace(self, **changes: t.Any) -> Settings:
        return dataclasses.replace(self, **changes)


def env_name(field_name: str) -> str:
    return PREFIX + field_name.upper()


def _coerce(raw: str, typ: t.Any) -> t.Any:
    if typ in (bool, "bool"):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if typ in (int, "int"):
        return int(raw)
    if typ in (float, "float"):
        return float(raw)
    return raw


def load_settings(environ: t.Mapping[str, str] | None = None, **overrides: t.Any) -> Settings:
    """Build Settings from ``TIDAL_*`` variables (``os.environ`` by default), then overrides."""
    environ = os.environ if environ is None else environ
    values: dict[str, t.Any] = {}
    for f in dataclasses.fields(Settings):
        raw = environ.get(env_name(f.name))
        if raw is not None and raw != "":
            values[f.name] = _coerce(raw, f.type)
    values.update(overrides)
    return Settings(**values)


def documented_fields() -> list[tuple[str, str, str]]:
    """(variable, default, doc) rows for docs/configuration.md."""
    rows = []
    for f in dataclasses.fields(Settings):
        default = f.default if f.default is not dataclasses.MISSING else "(computed)"
        rows.append((env_name(f.name), str(default), f.metadata["doc"]))
    return rows


def child_environ(**overrides: str) -> dict[str, str]:
    """The environment for a child process Tidal starts (``tidal up``): ours plus overrides."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in overrides.items()})
    return env
