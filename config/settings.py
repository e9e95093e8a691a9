"""Every Tidal setting, read once from ``TIDAL_*`` environment variables and checked once.

Nothing else in Tidal reads ``os.environ``: code receives a :class:`Settings`
(usually from :func:`load_settings`) and tests build one with overrides.
Each field's ``doc`` metadata is the single description of that setting;
``docs/configuration.md`` is checked against it by a test. Its bounds
(``ge``/``gt``/``le``/``lt``/``choices`` metadata) and the checks across fields
run whenever a Settings is built, so a process with a bad value stops at start-up
with a :class:`SettingsError` that names each variable and its fix, instead of
failing later in the request or task that first reads it. The values parsed from
text (price table, API keys, model list) are parsed then, once, and kept.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
import os
import socket
import typing as t
from pathlib import Path
from types import MappingProxyType

from config.redact import redacted

PREFIX = "TIDAL_"
DEV_KEY = ("dev", "tidal-dev-key")  # (tenant, key) that exists only when TIDAL_ENV=dev
MIN_KEY_CHARS, MIN_KEY_BITS = 32, 128  # a configured key outside dev mode: at least this long and this strong
MIN_KEY_DISTINCT = 8  # fewer distinct characters is a pattern, never a random key (40 random digits: p < 1e-4)
KEY_REPEAT_CHARS = 5  # a stretch this long that repeats an earlier one adds nothing to a key's strength
#: Keys Tidal has shipped in examples and tests: public, so never accepted outside dev mode whatever their length.
EXAMPLE_KEYS = frozenset({"tidal-dev-key", "change-me", "acme-key", "globex-key", "sk-tidal-example-0123456789abcdef"})


#: The /metrics pages (besides TIDAL_VLLM_URL) each TIDAL_GATE_SIGNALS map reads; tidal_workers.signals holds the
#: maps themselves, and a test checks the two agree.
GATE_SIGNAL_SOURCES: t.Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"vllm": (), "disagg": ("prefill", "decode"), "dynamo": ("prefill", "decode", "router")}
)
GATE_URL_SOURCES = ("prefill", "decode", "router")


class SettingsError(ValueError):
    """One or more settings are invalid; each line names the variable, what is wrong and the fix."""

    def __init__(self, problems: list[str]):
        self.problems = [redacted(p) for p in problems]  # a malformed URL setting is quoted, never its password
        problems = self.problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"invalid Tidal settings (fix these variables, or unset them for their defaults):\n{lines}")


def _setting(default: t.Any, doc: str, **kw: t.Any) -> t.Any:
    if callable(default) and not isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata={"doc": doc, **kw})
    return dataclasses.field(default=default, metadata={"doc": doc, **kw})


@dataclasses.dataclass(frozen=True)
class TenantLimits:
    """One tenant's quotas (``Settings.limits_for``)."""

    open_batches: int
    stored_bytes: int
    enqueued_tokens: t.Mapping[str, int]  # model -> limit; ``*`` for every other model
    weight: float = 1.0  # share of claims among tenants queued for a model, any priority (round robin at equal weights)

    def tokens_for(self, model: str) -> int:
        return self.enqueued_tokens.get(model, self.enqueued_tokens["*"])


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    """The TidalScheduler plugin's settings (``TIDAL_SCHED_*``): all that vLLM's engine-core process reads.

    The plugin loads these alone (:func:`load_scheduler_settings`), so the engine core never parses API keys,
    prices or tenant limits. :class:`Settings` includes them, for ``tidal engine`` to pass on and ``tidal config``
    to show.
    """

    sched_tbt_slo_ms: float = _setting(
        200.0,
        "TidalScheduler: online time-between-tokens SLO in ms; the step budget is this times (1 - guard).",
        gt=0,
    )
    sched_guard: float = _setting(
        0.2, "TidalScheduler: fraction of the TBT SLO kept free as a safety margin.", ge=0, lt=1
    )
    sched_r2_min: float = _setting(
        0.85,
        "TidalScheduler: R² below which the latency model is not trusted and the static cap applies.",
        ge=0,
        le=1,
    )
    sched_static_cap_frac: float = _setting(
        0.25,
        "TidalScheduler: static batch cap as a fraction of max_num_batched_tokens, used while online traffic is present and the model is untrusted.",
        ge=0,
        le=1,
    )
    sched_window: int = _setting(
        4000, "TidalScheduler: steps in the latency model's rolling least-squares window.", ge=1
    )
    sched_h_min: float = _setting(0.05, "TidalScheduler: lower clamp of the KV guardband H.", ge=0, le=1)
    sched_h_max: float = _setting(0.30, "TidalScheduler: upper clamp of the KV guardband H.", ge=0, le=1)
    sched_h_alpha: float = _setting(
        0.05,
        "TidalScheduler: EWMA weight of each step's online KV demand in the guardband H.",
        gt=0,
        le=1,
    )
    sched_alpha_set: float = _setting(
        1.1,
        "TidalScheduler: the budget multiplier, how much online latency batch work may add. Above 1, each step with online traffic may take at most this times T̂(its online work alone), each batch decode priced by its own KV read and the rest of the batch parked (docs/engine.md, the relative budget); the TBT SLO less its guard stays a ceiling. 1.1: the largest the frontier measured whose online inflation stayed within 1.15× on every workload (docs/engine.md, the shipped α). 0: the absolute budget alone (the TBT SLO less its guard).",
        ge=0,
    )
    sched_profile: str = _setting(
        "",
        "TidalScheduler: a profile of `tidal_engine/twin_profiles.toml` (`model@gpu`) whose step-time form T̂ the relative budget prices steps with; empty: the latency model fitted on the engine's own steps.",
    )
    sched_max_park_seconds: float = _setting(
        60.0,
        "TidalScheduler, relative budget: a batch request parked (running, its KV held, no token scheduled) this long is preempted, its KV freed; it waits to be admitted again.",
        gt=0,
    )
    sched_metrics_port: int = _setting(
        0,
        "TidalScheduler: port of its Prometheus endpoint in the engine-core process; 0 turns it off.",
        ge=0,
        le=65535,
    )
    sched_metrics_host: str = _setting(
        "127.0.0.1",
        "TidalScheduler: address its Prometheus endpoint binds (`0.0.0.0` where Prometheus runs elsewhere).",
    )

    @property
    def sched_budget_seconds(self) -> float:
        """TidalScheduler's step budget: the TBT SLO less its guard."""
        return self.sched_tbt_slo_ms / 1000.0 * (1.0 - self.sched_guard)

    def __post_init__(self) -> None:
        problems = _field_problems(self) + _scheduler_problems(self)
        if problems:
            raise SettingsError(problems)


@dataclasses.dataclass(frozen=True)
class Settings(SchedulerSettings):
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
    s3_secret_access_key: str = _setting(
        "", "`TIDAL_STORAGE=s3`: secret key, with `TIDAL_S3_ACCESS_KEY_ID`.", secret=True
    )
    s3_part_bytes: int = _setting(
        8 * 1024 * 1024,
        "`TIDAL_STORAGE=s3`: part size of multipart uploads (at least S3's 5 MiB); each upload holds one part in memory.",
    )
    redis_url: str = _setting(
        "redis://127.0.0.1:6379/0", "Redis for the item queue, leases and beat's lock. Holds only what SQL can rebuild."
    )
    broker_url: str = _setting("", "Celery broker URL. Empty: the same as `TIDAL_REDIS_URL`.")
    vllm_url: str = _setting(
        "http://127.0.0.1:8000",
        "The co-located vLLM server this worker feeds (OpenAI API and /metrics), reached directly: the worker's client applies no `HTTP_PROXY`/`NO_PROXY`, `.netrc` or `REQUESTS_CA_BUNDLE` from the environment.",
    )

    # --- the API -----------------------------------------------------------
    api_keys: str = _setting(
        "",
        "Configured API keys as `tenant:key` pairs separated by commas. Stored hashed (SHA-256) at start-up; a configured key removed from here stays live until `tidal keys sync --prune` revokes it. Outside dev mode each key must be at least 32 characters, of 8 distinct ones at least, with 128 bits of entropy by its character set, a repeated stretch counted once (`tidal keys create` makes such keys).",
        secret=True,
    )
    bind: str = _setting("127.0.0.1:8080", "Address gunicorn binds for `tidal serve`.")
    metrics_bind: str = _setting(
        "",
        "`host:port` where `tidal serve` also listens for Prometheus (compose: `0.0.0.0:9180`): the API's `/metrics`, and `/ready` with each failing check's reason, are answered only on this port, never on `TIDAL_BIND`. Empty: the API serves no `/metrics` at all.",
    )
    api_workers: int = _setting(2, "gunicorn worker processes for the API.", ge=1)
    api_threads: int = _setting(4, "Threads per gunicorn worker (gthread).", ge=1)
    max_file_bytes: int = _setting(
        200 * 1024 * 1024,
        "Largest accepted upload for purpose `batch`, in bytes (OpenAI: 200 MB).",
        ge=1,
    )
    max_upload_bytes: int = _setting(512 * 1024 * 1024, "Largest accepted upload of any purpose, in bytes.", ge=1)
    max_file_lines: int = _setting(50_000, "Most request lines in a batch input file (OpenAI: 50,000).", ge=1)
    max_line_bytes: int = _setting(
        1024 * 1024,
        "Largest request line of a batch input file, in bytes: a longer line is a `line_too_large` error, skipped unread (ingest holds a few times this for one line).",
        ge=1024,
    )
    models: str = _setting(
        "",
        "Comma-separated model names a batch may name; empty accepts any (then `model_not_found` never fires, each name the engine answers to, an alias or a LoRA adapter loaded by name, has its own per-model token quota, and the API warns at start outside dev mode). Set it in production.",
    )
    sync_validate_bytes: int = _setting(
        1024 * 1024,
        "Input files up to this size are validated inside `POST /v1/batches`; larger ones by a Celery task.",
        ge=0,
    )
    completion_window_seconds: int = _setting(
        86_400,
        "Real length of the completion window. The wire value stays `24h`; tests shorten this.",
        ge=1,
    )
    file_expiry_seconds: int = _setting(
        30 * 86_400,
        "Lifetime of uploaded and output files (`expires_at`) unless the upload's `expires_after` or the batch's `output_expires_after` says otherwise; beat's retention sweep deletes expired files.",
        ge=1,
    )
    item_retention_seconds: int = _setting(
        7 * 86_400,
        "How long a finished batch keeps its item rows (prompts and responses) in SQL; its output and error files keep the lines until they expire. 0: deleted at the next retention sweep.",
        ge=0,
    )
    batch_retention_seconds: int = _setting(
        0,
        "How long a finished batch keeps what its tenant wrote into it (`metadata`) and its validation errors (which quote lines) after it finished; then the retention sweep clears both. The row stays, with its status, counts, usage and file ids (OpenAI lists batches without end, and the API's counters sum over batch rows). 0: kept for ever.",
        ge=0,
    )
    max_output_tokens: int = _setting(
        32_768,
        "Largest `max_tokens` (`max_completion_tokens`, `max_output_tokens`) a request line may ask for: the served model's limit (vLLM's `--max-model-len`). A line without one is counted at this in the enqueued-token quota.",
        ge=1,
    )
    prompt_bytes_per_token: float = _setting(
        4.0,
        "The enqueued-token quota estimates a line's prompt tokens as its prompt text's UTF-8 bytes over this (plus 4 per message); 1 makes the estimate an upper bound for byte-level BPE tokenizers.",
        gt=0,
    )

    # --- quotas (per tenant; TIDAL_TENANT_LIMITS overrides them for named tenants) ---------
    limit_enqueued_tokens: int = _setting(
        5_000_000_000,
        "Per tenant and model: estimated tokens (prompt plus `max_tokens`) of batches not yet finished. A batch that would pass it fails validation with `token_limit_exceeded`. The default holds three full batches (50,000 lines) counted at a 32k-token model limit.",
        ge=0,
    )
    limit_open_batches: int = _setting(
        100,
        "Per tenant: batches validating, in progress, finalizing or cancelling. Creating one more answers 429 `batch_limit_exceeded`.",
        ge=0,
    )
    limit_stored_bytes: int = _setting(
        20 * 1024**3,
        "Per tenant: bytes of live files (uploads and batch outputs). An upload past it answers 400 `storage_limit_exceeded`, as does a new batch while the tenant is at it; finalize writes a batch's output and error files even past it (they hold the only copy of its results).",
        ge=0,
    )
    tenant_limits: str = _setting(
        "{}",
        'JSON: tenant -> its own limits, any of `open_batches`, `stored_bytes`, `enqueued_tokens` (a number, or model -> number with `*` for other models), `weight` (its share of claims among tenants whose batches are queued for the same model, whatever their priorities, a number from 0.001 to 1000; default 1: items in turn); unnamed limits and tenants get the `TIDAL_LIMIT_*` defaults and weight 1. Example: `{"acme": {"open_batches": 500, "enqueued_tokens": {"*": 5000000000}, "weight": 3}}`.',
    )

    # --- workers -----------------------------------------------------------
    node: str = _setting(
        lambda: socket.gethostname(), "Name of this GPU node; leases and in-flight counts are kept per node."
    )
    worker_threads: int = _setting(
        0,
        "Threads in a GPU node worker's pool, each holding one claimed item (waiting for its engine token, at the engine, or being recorded): the most items the node claims. 0: the gate's ceiling as known at start (`TIDAL_MAX_INFLIGHT`, else `TIDAL_MAX_NUM_SEQS` less the headroom, else 64) plus `TIDAL_DISPATCH_PREFETCH` plus 2.",
        ge=0,
    )
    max_inflight: int = _setting(
        0,
        "Override of the gate's ceiling: the most batch requests a node keeps at its engine. 0: from the engine, `min(TIDAL_MAX_NUM_SEQS, KV capacity / TIDAL_BATCH_REQUEST_TOKENS) × (1 − TIDAL_ONLINE_HEADROOM)`, the KV capacity read from vLLM's `vllm:cache_config_info`; 4 while the engine tells neither.",
        ge=0,
    )
    max_num_seqs: int = _setting(
        0,
        "The engine's slot count (vLLM's `--max-num-seqs`), which a stock /metrics does not show: compose and `tidal engine serve` pass this one value to the engine and the worker. 0: unknown (vLLM's own default on the engine).",
        ge=0,
    )
    online_headroom: float = _setting(
        0.25,
        "Share of the engine's slots and KV cache the gate's ceiling leaves for the online peak, when the ceiling comes from the engine.",
        ge=0,
        lt=1,
    )
    batch_request_tokens: int = _setting(
        2048,
        "KV tokens one batch request may hold (prompt and output), for the KV bound of the gate's ceiling.",
        ge=1,
    )
    min_inflight: int = _setting(0, "Lower bound of the gate; the fail-safe closes it to this.", ge=0)
    initial_inflight: int = _setting(1, "Gate target when a worker starts.", ge=0)
    lease_seconds: float = _setting(
        30.0,
        "Lease on a claimed item; renewed every third of it by the renewal thread, and trusted by its node without asking Redis for half of it after each claim or renewal. A claim whose task has not started within it (revoked, lost) is given back.",
        gt=0,
    )
    claim_idle_seconds: float = _setting(
        0.1,
        "How long the claim loop sleeps when it claims nothing (a settled item on the node wakes it early).",
        gt=0,
    )
    dispatch_prefetch: int = _setting(
        2,
        "Items a node claims beyond its gate's target, each waiting on a pool thread for an engine token, so a request the engine answers is replaced in milliseconds; none while the target is 0.",
        ge=0,
        le=64,
    )
    prefetch_max_age_seconds: float = _setting(
        2.0,
        "A prefetched item that has waited this long for an engine token (the gate closed, or the engine slowed) goes back to the queue for any node.",
        gt=0,
    )
    request_timeout_seconds: float = _setting(600.0, "Timeout of one HTTP request to vLLM.", gt=0)
    prefill_stage_tokens: int = _setting(
        0,
        "Staged prefill, for a stock engine that also serves online traffic: a batch prompt is first warmed in vLLM's prefix cache by requests of one output token on its first N, 2N, ... tokens, so no engine step computes more than N of its tokens; a chat or completions item with a text prompt only. N should be a multiple of the engine's KV block (16 tokens on GPUs, 128 on vLLM's CPU backend): the prefix cache keeps whole blocks. 0: the whole prompt goes in one request, so into one step (docs/architecture.md, staged prefill).",
        ge=0,
    )
    prefill_stage_min_tokens: int = _setting(
        256,
        "Staged prefill's floor: a prompt of at most this many tokens goes whole, staged or not. Staging it would cut its one step by less than a chunk at the price of a warm-up request and a step more through the engine; on the twin's decode-heavy mix (prompts ~200 tokens) the warm-ups raised online TTFT more than they saved (docs/architecture.md, staged prefill). 0: every prompt longer than a chunk is staged.",
        ge=0,
    )
    max_response_bytes: int = _setting(
        16 * 2**20,
        "Largest engine answer a worker keeps for one item, in bytes. A longer one (a long output with many logprobs can be tens of MB) is read through but not kept: the item becomes an error line `response_too_large`, with the usage the answer ends with recorded on its row.",
        ge=4096,
    )
    cache_salt_secret: str = _setting(
        "",
        "Secret of the `cache_salt` every batch request carries (an HMAC of its tenant), so batch prompts share vLLM's prefix cache only within their tenant, never with another tenant or with online traffic, and `cached_tokens` reveals no one else's prompt. Set it in production (the same on every node): without it the salt is still per tenant, but an online client who knows a tenant's name could compute it.",
        secret=True,
    )
    retry_budget: int = _setting(
        8,
        "Transient failures an item may suffer while its engine is up (a timeout, a broken connection or a 5xx while /health answers, a 429) before it is written as failed; an engine outage uses none.",
        ge=0,
    )
    retry_backoff_seconds: float = _setting(0.5, "First retry delay; doubles each time, capped at 30 s.", ge=0)
    engine_probe_seconds: float = _setting(
        2.0,
        "While this node's engine is down (refused, or failing its /health) or fails its preflight, how often the claim loop probes it to resume claiming.",
        gt=0,
    )
    engine_crash_limit: int = _setting(
        3,
        "Engine deaths an item may be at the engine for (its request broken or timed out while /health fails) before it is written as failed with `engine_crash` rather than handed back: a line that kills the engine is not replayed on every node for its whole window.",
        ge=1,
    )
    reclaim_limit: int = _setting(
        3,
        "Times an item's lease may expire (its worker died: killed, out of memory; or was cut off from Redis past its lease) before the item is written as failed with `worker_lost` rather than queued again: a line that kills its worker is not rerun for its whole window. Hand-backs (an engine outage, a failed preflight, a stopping worker) count nothing.",
        ge=1,
    )
    ops_worker_threads: int = _setting(
        2,
        "Threads of the ops worker's control process (`tidal worker --ops`: finalize and beat's sweeps, the `tidal.ops` queue); ingests never take them.",
        ge=1,
    )
    ingest_worker_threads: int = _setting(
        2,
        "Threads of the ops worker's ingest process (the `tidal.ingest` queue): input files validated at once; each ingest holds at most about 100 MB.",
        ge=1,
    )
    ingests_per_tenant: int = _setting(
        1,
        "Ingest attempts one tenant may have running at once; its other batches stay `validating` and start as its running ones end, leaving the other ingest threads to other tenants. Ingest is CPU-bound under one interpreter lock, so a tenant's second ingest at once would add no speed, only take a thread.",
        ge=1,
    )
    ingest_attempts: int = _setting(
        3,
        "Attempts at validating a batch's input file (ingest) before the batch fails with `ingest_failed`; an attempt whose process died counts.",
        ge=1,
    )
    finalize_attempts: int = _setting(
        5,
        "Attempts at writing a finished batch's output and error files before the batch fails with `finalize_failed` (its results stay in SQL); an attempt whose process died counts. Reconcile starts the next one `TIDAL_RECONCILE_SECONDS` after the first, doubling the wait each time.",
        ge=1,
    )
    ingest_backoff_seconds: float = _setting(
        10.0, "Delay before an ingest attempt that raised an error is retried; doubles per attempt.", ge=0
    )
    worker_metrics_port: int = _setting(
        9187,
        "Port of the worker's Prometheus endpoint (gate target, queue depth by band, in-flight by node); 0 turns it off.",
        ge=0,
        le=65535,
    )
    ops_metrics_port: int = _setting(
        9189,
        "Port of the ops worker's (`tidal worker --ops`) Prometheus endpoint, with `/health` and `/ready` (SQL, Redis, storage); 0 turns it off.",
        ge=0,
        le=65535,
    )

    # --- the AIMD gate ------------------------------------------------------
    gate_mode: str = _setting(
        "aimd",
        "`aimd`: the in-flight target follows the co-located vLLM's /metrics (KV use, online waiting, preemptions); `latency`: the same, but between KV pressure and preemptions it follows online inter-token latency, kept within `TIDAL_GATE_ALPHA_SET` of its online-alone reference (docs/architecture.md, the gate); `fixed`: it stays at `TIDAL_MAX_INFLIGHT`.",
        choices=("aimd", "latency", "fixed"),
    )
    gate_alpha_set: float = _setting(
        1.15,
        "`latency` gate: the budget multiplier, how much online inter-token latency batch work may add (1.15: each online token up to 15 % later than with online work alone; the outside technique's shipped value, chosen on the frontier where 1.2 put TTFT p50 on the outside must-hold's 1.20× bound at 8 online requests/s, docs/benchmarks.md).",
        gt=1,
    )
    gate_reference_itl_ms: float = _setting(
        0.0,
        "`latency` gate: the engine's online-alone inter-token latency in ms, where known (the profile's decode step, a calibration run); 0: fitted from the engine's own readings, inter-token latency against the batch working set, down to no batch.",
        ge=0,
    )
    gate_profile: str = _setting(
        "",
        "`latency` gate without a given reference: a profile of `tidal_engine/twin_profiles.toml` (`model@gpu`, `*K` time-scaled) whose step-time form predicts the online-alone inter-token latency at the online load the engine serves, levelled by the engine's measured latency, and on whose inflation the target then moves (the measured one rules 0.25 over `TIDAL_GATE_ALPHA_SET`; docs/architecture.md, the gate); empty: the reference is fitted and the target moves on the measured inflation.",
    )
    scrape_seconds: float = _setting(1.0, "Period of the /metrics scrape and of the AIMD controller.", gt=0)
    ewma_alpha: float = _setting(0.5, "Smoothing of KV usage and waiting counts (1 = no smoothing).", gt=0, le=1)
    kv_high: float = _setting(0.85, "KV cache usage (EWMA) above which the target is halved.", ge=0, le=1)
    kv_low: float = _setting(0.70, "KV cache usage (EWMA) below which the target grows by one per period.", ge=0, le=1)
    online_waiting_tolerance: float = _setting(
        0.0,
        "Online requests waiting (EWMA) tolerated before the target is halved.",
        ge=0,
    )
    metrics_stale_seconds: float = _setting(5.0, "A reading older than this closes the gate (fail-safe).", gt=0)
    gate_signals: str = _setting(
        "vllm",
        "Names the gate reads its signals by (docs/architecture.md, signal maps): `vllm` (the co-located vLLM at `TIDAL_VLLM_URL`), `disagg` (a prefill and a decode pool of vLLM engines) or `dynamo` (NVIDIA Dynamo's worker and frontend names). `disagg` and `dynamo` read the pages in `TIDAL_GATE_METRICS_URLS`.",
        choices=tuple(GATE_SIGNAL_SOURCES),
    )
    gate_metrics_urls: str = _setting(
        "",
        "The /metrics pages of a disaggregated deployment, as `SOURCE=URL` pairs separated by commas, SOURCE one of `prefill`, `decode`, `router`; e.g. `prefill=http://10.0.0.5:8000/metrics,decode=http://10.0.0.6:8000/metrics`. Each source `TIDAL_GATE_SIGNALS` reads must be named.",
    )

    # --- the phase split: freeze / thaw -----------------------------------
    kv_freeze_dir: str = _setting(
        "",
        "Folder the engines' TidalFreezeConnector freezes batch KV under (its `shared_storage_path`, one subfolder per batch; mounted on every node). Beat's retention sweep measures and bills each batch's folder and deletes it when the batch ends. Set: ingest may split items (`tidal.phase_split`). Empty: the engines do not freeze, so no item is split and no frozen KV is accounted.",
    )
    kv_storage_usd_per_gib_hour: float = _setting(
        3.2e-5,
        "Price of holding split items' frozen KV, USD per GiB-hour, billed in `tidal report` and the batch's `tidal.kv_storage_usd`. Default: S3 Standard's list price, 0.023 USD per GB-month.",
        ge=0,
    )
    phase_split_always: bool = _setting(
        False,
        "Whether a tenant may create a batch with `tidal.phase_split: always` (split every item the engines can freeze, whatever its laxity, each writing its prompt's KV to the shared freeze folder). Off: `always` is refused with a 400 and only `auto` and `never` are accepted. Frozen KV counts against the tenant's stored bytes (`TIDAL_LIMIT_STORED_BYTES`) either way, and a tenant at that limit has no item split.",
    )

    # --- SLA: laxity, escalation, floor ------------------------------------
    escalation_horizon_seconds: float = _setting(
        6 * 3600.0, "H: laxity below this starts raising a batch's priority.", gt=0
    )
    batch_priority_min: int = _setting(
        1, "Most urgent priority a batch may reach (vLLM priority; lower is sooner).", ge=0, le=100
    )
    sla_strict: bool = _setting(
        False, "Allow priority 0 (parity with online traffic) for a batch about to miss its window."
    )
    floor_urgency: float = _setting(
        0.9,
        "Urgency past which the token-bucket floor admits a batch's tenant even when the gate is closed.",
        ge=0,
        le=1,
    )
    rate_tau_seconds: float = _setting(
        900.0,
        "Time constant of a batch's observed-rate estimate: how fast its laxity (and ETA) follows a burst or a stall.",
        gt=0,
    )
    floor_rate: float = _setting(
        0.5,
        "Guaranteed items per second per node for each tenant with urgent batches (one token bucket per tenant, however many batches it has), past the gate; 0 turns the floor off.",
        ge=0,
    )
    floor_share: float = _setting(
        0.1,
        "Most of a node's worker pool (`TIDAL_WORKER_THREADS`, by default the gate's ceiling + `TIDAL_DISPATCH_PREFETCH` + 2) the floor may hold past the gate, all urgent tenants together: at most max(1, ⌊share × pool⌋) items at once (19 of a 196-thread pool); the tenants take the room in turn.",
        gt=0,
        le=1,
    )
    rescore_seconds: float = _setting(5.0, "Period of beat's laxity re-score.", gt=0)
    reclaim_seconds: float = _setting(5.0, "Period of beat's expired-lease sweep.", gt=0)
    expiry_seconds: float = _setting(30.0, "Period of beat's expiry sweep.", gt=0)
    reconcile_seconds: float = _setting(60.0, "Period of beat's Redis-from-SQL reconcile.", gt=0)
    retention_seconds: float = _setting(
        300.0, "Period of beat's retention sweep (expired files, finished batches' item rows, idempotency keys).", gt=0
    )
    ingest_resend_seconds: float = _setting(
        300.0,
        "Reconcile sends `tidal.ingest` again for a batch still `validating` this long after its creation or its last ingest attempt began (the broker may have been down, the attempt's process killed), doubling per attempt; it must exceed the longest ingest (a 200 MB file: 10-20 s on a 2-core machine).",
        gt=0,
    )
    beat_lock_seconds: int = _setting(
        20, "RedBeat lock timeout: how long a standby beat waits before taking over.", ge=1
    )

    # --- pricing -----------------------------------------------------------
    prices: str = _setting(
        '{"*": [0.15, 0.60]}',
        "JSON: model -> [online USD per 1M input tokens, per 1M output tokens]; `*` is the default.",
    )
    batch_discount: float = _setting(0.5, "Batch price as a fraction of the online price.", ge=0, le=1)

    # --- Flower ------------------------------------------------------------
    flower_port: int = _setting(5555, "Port of the Flower UI started by `tidal up --flower`.", ge=1, le=65535)
    flower_basic_auth: str = _setting(
        "",
        "`user:password` for Flower (several pairs: separated by commas); required by docker-compose. `tidal flower` hands it to Flower in its environment, never on its command line. Outside dev mode each password must be as strong as an API key (at least 32 characters with 128 bits of entropy).",
        secret=True,
    )

    # --- where the internal listeners bind -------------------------------------------------------
    worker_metrics_host: str = _setting(
        "127.0.0.1",
        "Address the worker's and the ops worker's Prometheus endpoints (`/metrics`, `/health`, `/ready`) bind: loopback unless Prometheus scrapes from another host (compose: `0.0.0.0`, on its private network only). They show every tenant's batch ids and `/ready`'s reasons.",
    )

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

    # Parsed once, when the Settings is built (``__post_init__`` checks them), then kept: cached_property
    # writes the instance's __dict__ directly, which a frozen dataclass allows.
    @functools.cached_property
    def model_list(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.models.split(",") if m.strip())

    @property
    def price_table(self) -> t.Mapping[str, tuple[float, float]]:
        """model -> (online USD per 1M input tokens, per 1M output tokens), with a ``*`` row (read-only)."""
        return MappingProxyType(self._prices)

    @functools.cached_property
    def _prices(self) -> dict[str, tuple[float, float]]:
        return _parse_prices(self.prices)

    @functools.cached_property
    def configured_keys(self) -> tuple[tuple[str, str], ...]:
        """(tenant, key) pairs from TIDAL_API_KEYS, plus the dev key in dev mode. Weak keys refused outside dev."""
        pairs = _parse_keys(self.api_keys)
        if self.env == "dev":
            return (*pairs, DEV_KEY)
        for n, (_tenant, key) in enumerate(pairs, 1):
            if why := weak_key(key):
                raise ValueError(
                    f"TIDAL_API_KEYS entry {n} is {why}; outside dev mode (TIDAL_ENV=dev) every key needs at least "
                    f"{MIN_KEY_CHARS} characters and {MIN_KEY_BITS} bits of entropy: create one with `tidal keys "
                    "create` or `python -c 'import secrets; print(\"sk-\" + secrets.token_urlsafe(32))'`."
                )
        return pairs

    @functools.cached_property
    def _tenant_limits(self) -> dict[str, dict[str, t.Any]]:
        return _parse_tenant_limits(self.tenant_limits)

    def limits_for(self, tenant: str) -> TenantLimits:
        """The tenant's quotas: its TIDAL_TENANT_LIMITS entry over the TIDAL_LIMIT_* defaults."""
        own = self._tenant_limits.get(tenant, {})
        tokens = own.get("enqueued_tokens", self.limit_enqueued_tokens)
        if not isinstance(tokens, dict):
            tokens = {"*": tokens}
        return TenantLimits(
            open_batches=own.get("open_batches", self.limit_open_batches),
            stored_bytes=own.get("stored_bytes", self.limit_stored_bytes),
            enqueued_tokens=MappingProxyType({"*": self.limit_enqueued_tokens, **tokens}),
            weight=float(own.get("weight", 1.0)),
        )

    @functools.cached_property
    def gate_metrics_url_map(self) -> t.Mapping[str, str]:
        """source -> /metrics URL, from TIDAL_GATE_METRICS_URLS (read-only)."""
        return MappingProxyType(
            _parse_gate_urls(self.gate_metrics_urls, GATE_SIGNAL_SOURCES.get(self.gate_signals, ()))
        )

    def replace(self, **changes: t.Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        problems = _field_problems(self) + _scheduler_problems(self) + _cross_problems(self)
        for name in ("_prices", "configured_keys", "_tenant_limits", "gate_metrics_url_map"):
            try:
                getattr(self, name)  # parse now, and keep the result
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise SettingsError(problems)


# --- checks ------------------------------------------------------------------
_BOUNDS: dict[str, tuple[str, t.Callable[[float, float], bool]]] = {
    "ge": ("at least", operator.ge),
    "gt": ("above", operator.gt),
    "le": ("at most", operator.le),
    "lt": ("below", operator.lt),
}


def _field_problems(s: SchedulerSettings) -> list[str]:
    """Each field against its own ``ge``/``gt``/``le``/``lt``/``choices`` metadata."""
    problems = []
    for f in dataclasses.fields(s):
        value, name = getattr(s, f.name), env_name(f.name)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            problems.append(f"{name}={value!r}: must be one of {', '.join(choices)}.")
        limits = [(key, f.metadata[key]) for key in _BOUNDS if key in f.metadata]
        if not limits:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(f"{name}={value!r}: must be a finite number.")
            continue
        if not all(_BOUNDS[key][1](value, bound) for key, bound in limits):
            wanted = " and ".join(f"{_BOUNDS[key][0]} {bound:g}" for key, bound in limits)
            problems.append(f"{name}={value!r}: must be {wanted} (default {f.default!r}).")
    return problems


def _scheduler_problems(s: SchedulerSettings) -> list[str]:
    problems = []
    if s.sched_h_min > s.sched_h_max:
        problems.append(
            f"TIDAL_SCHED_H_MIN={s.sched_h_min} exceeds TIDAL_SCHED_H_MAX={s.sched_h_max}: the guardband's lower "
            "clamp must not exceed its upper clamp."
        )
    if 0 < s.sched_alpha_set <= 1:
        problems.append(
            f"TIDAL_SCHED_ALPHA_SET={s.sched_alpha_set}: must exceed 1 (a step may take that many times its online "
            "work alone), or be 0 for the absolute budget."
        )
    return problems


def _cross_problems(s: Settings) -> list[str]:
    """Checks that relate two settings, or need more than a number's bounds."""
    problems = []
    if s.kv_low > s.kv_high:
        problems.append(
            f"TIDAL_KV_LOW={s.kv_low} exceeds TIDAL_KV_HIGH={s.kv_high}: the gate grows below KV_LOW and halves "
            "above KV_HIGH, so KV_LOW must not exceed KV_HIGH; lower TIDAL_KV_LOW or raise TIDAL_KV_HIGH."
        )
    if s.max_inflight and s.min_inflight > s.max_inflight:
        problems.append(
            f"TIDAL_MIN_INFLIGHT={s.min_inflight} exceeds TIDAL_MAX_INFLIGHT={s.max_inflight}: the gate's lower "
            "bound must not exceed its upper bound."
        )
    for field_name, schemes, example in (
        ("redis_url", ("redis://", "rediss://", "unix://"), "redis://127.0.0.1:6379/0"),
        ("vllm_url", ("http://", "https://"), "http://127.0.0.1:8000"),
    ):
        value = getattr(s, field_name)
        if not value.startswith(schemes):
            problems.append(f"{env_name(field_name)}={value!r}: must be a URL such as {example}.")
    for field_name in ("database_url", "broker_url"):
        value = getattr(s, field_name)
        if value and "://" not in value:
            problems.append(
                f"{env_name(field_name)}={value!r}: must be a URL (scheme://...), or empty for the default."
            )
    if s.metrics_bind:
        host, _, port = s.metrics_bind.rpartition(":")
        if not (host and port.isdigit() and 0 < int(port) < 65536):
            problems.append(f"TIDAL_METRICS_BIND={s.metrics_bind!r}: must be host:port (or empty for no /metrics).")
        elif port == s.bind.rpartition(":")[2]:
            problems.append(
                f"TIDAL_METRICS_BIND={s.metrics_bind!r} uses the port of TIDAL_BIND={s.bind!r}: /metrics must not be "
                "served on the API's public port; pick another port."
            )
    problems += _flower_auth_problems(s)
    return problems


def _flower_auth_problems(s: Settings) -> list[str]:
    """TIDAL_FLOWER_BASIC_AUTH: user:password pairs; outside dev mode each password as strong as an API key."""
    if not s.flower_basic_auth:
        return []
    for n, pair in enumerate(s.flower_basic_auth.split(","), 1):
        user, colon, password = pair.partition(":")
        if not (user and colon and password):
            return ["TIDAL_FLOWER_BASIC_AUTH: must be user:password (several pairs separated by commas), or empty."]
        if s.env != "dev" and (why := weak_key(password)):
            return [
                f"TIDAL_FLOWER_BASIC_AUTH pair {n}: the password is {why}; outside dev mode it needs at least "
                f"{MIN_KEY_CHARS} characters and {MIN_KEY_BITS} bits of entropy, e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`."
            ]
    return []


def _parse_gate_urls(text: str, needed: tuple[str, ...]) -> dict[str, str]:
    urls: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        source, sep, url = (x.strip() for x in part.partition("="))
        if not sep or source not in GATE_URL_SOURCES or not url.startswith(("http://", "https://")):
            raise ValueError(
                f"TIDAL_GATE_METRICS_URLS entry {part!r} is not SOURCE=http(s)://... with SOURCE one of "
                f"{', '.join(GATE_URL_SOURCES)}."
            )
        urls[source] = url
    if lacking := [src for src in needed if src not in urls]:
        raise ValueError(
            f"TIDAL_GATE_METRICS_URLS names no page for {', '.join(lacking)}, which TIDAL_GATE_SIGNALS reads; add "
            f"{lacking[0]}=http://HOST:PORT/metrics."
        )
    return urls


def _parse_prices(text: str) -> dict[str, tuple[float, float]]:
    fix = 'set it to a JSON object such as {"*": [0.15, 0.60], "my-model": [1.0, 2.0]}'
    try:
        table = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"TIDAL_PRICES is not JSON ({exc}); {fix}.") from None
    if not isinstance(table, dict):
        raise ValueError(f"TIDAL_PRICES must be a JSON object of model -> [input, output] USD per 1M tokens; {fix}.")
    prices = {}
    for model, pair in table.items():
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and all(
                isinstance(p, int | float) and not isinstance(p, bool) and math.isfinite(p) and p >= 0 for p in pair
            )
        ):
            raise ValueError(
                f"TIDAL_PRICES[{model!r}] = {json.dumps(pair)}: must be [input, output], two non-negative numbers "
                "(USD per 1M tokens)."
            )
        prices[model] = (float(pair[0]), float(pair[1]))
    if "*" not in prices:
        raise ValueError(f'TIDAL_PRICES has no "*" row, the price of models it does not name; {fix}.')
    return prices


def _parse_keys(text: str) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for n, chunk in enumerate(text.split(","), 1):
        entry = chunk.strip()
        if not entry:
            continue
        tenant, _, key = entry.partition(":")
        if not tenant or not key:
            raise ValueError(
                f"TIDAL_API_KEYS entry {n} is not tenant:key (a tenant name, a colon, then the key); "
                "entries are separated by commas, e.g. acme:sk-1,globex:sk-2."
            )
        if len(tenant) > 64:
            raise ValueError(f"TIDAL_API_KEYS entry {n}: the tenant name is longer than 64 characters.")
        if key in {k for _, k in pairs}:
            raise ValueError(
                f"TIDAL_API_KEYS entry {n} repeats the key of an earlier entry; each key names one tenant."
            )
        pairs.append((tenant, key))
    return tuple(pairs)


_CHARSETS = (
    (str.islower, 26),
    (str.isupper, 26),
    (str.isdigit, 10),
)


def key_bits(key: str) -> float:
    """Entropy of ``key`` by its character set: its fresh characters (``fresh_chars``) × log2(size of the classes
    it draws from)."""
    alphabet = sum(size for test, size in _CHARSETS if any(test(c) for c in key if c.isascii()))
    if any(not (c.isascii() and c.isalnum()) for c in key):
        alphabet += 33  # printable ASCII punctuation and anything else
    return fresh_chars(key) * math.log2(alphabet) if alphabet > 1 else 0.0


def fresh_chars(key: str) -> int:
    """How many characters of ``key`` lie in no stretch of KEY_REPEAT_CHARS that also starts earlier in it (the two
    may overlap: ``"x7Q2" * 10`` has 4 fresh characters, ``"a" * 32`` 1): a repeat is as easy to guess as its first
    copy."""
    n = KEY_REPEAT_CHARS
    repeated: set[int] = set()
    for i in range(1, len(key) - n + 1):
        if key.find(key[i : i + n], 0, i + n - 1) != -1:
            repeated.update(range(i, i + n))
    return len(key) - len(repeated)


def weak_key(key: str) -> str | None:
    """Why ``key`` is too weak to guard a tenant outside dev mode, or None; the reason never quotes the key."""
    if key in EXAMPLE_KEYS:
        return "a published example key"
    if len(key) < MIN_KEY_CHARS:
        return f"{len(key)} characters long"
    if (distinct := len(set(key))) < MIN_KEY_DISTINCT:
        return f"made of only {distinct} distinct characters"
    bits = key_bits(key)
    if bits < MIN_KEY_BITS:
        repeats = ", its repeats counted once" if fresh_chars(key) < len(key) else ""
        return f"only {bits:.0f} bits strong by its character set{repeats}"
    return None


_LIMIT_NAMES = ("open_batches", "stored_bytes", "enqueued_tokens", "weight")
WEIGHT_BOUNDS = (0.001, 1000.0)  # a tenant's claim weight: 1,000 turns to 1 at the most


def _limit_number(value: t.Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _weight(value: t.Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and WEIGHT_BOUNDS[0] <= value <= WEIGHT_BOUNDS[1]
    )


def _parse_tenant_limits(text: str) -> dict[str, dict[str, t.Any]]:
    fix = 'set it to a JSON object such as {"acme": {"open_batches": 500, "enqueued_tokens": {"*": 5000000000}}}'
    try:
        table = json.loads(text or "{}")
    except ValueError as exc:
        raise ValueError(f"TIDAL_TENANT_LIMITS is not JSON ({exc}); {fix}.") from None
    if not isinstance(table, dict):
        raise ValueError(f"TIDAL_TENANT_LIMITS must be a JSON object of tenant -> limits; {fix}.")
    for tenant, limits in table.items():
        if not isinstance(limits, dict) or set(limits) - set(_LIMIT_NAMES):
            raise ValueError(f"TIDAL_TENANT_LIMITS[{tenant!r}] must be an object of {', '.join(_LIMIT_NAMES)}; {fix}.")
        for name, value in limits.items():
            if name == "weight":
                if not _weight(value):
                    raise ValueError(
                        f"TIDAL_TENANT_LIMITS[{tenant!r}]['weight'] = {json.dumps(value)}: must be a number from "
                        f"{WEIGHT_BOUNDS[0]:g} to {WEIGHT_BOUNDS[1]:g} (the tenant's share of claims; default 1)."
                    )
                continue
            numbers = value.values() if name == "enqueued_tokens" and isinstance(value, dict) else [value]
            if not numbers or not all(_limit_number(v) for v in numbers):
                raise ValueError(
                    f"TIDAL_TENANT_LIMITS[{tenant!r}][{name!r}] = {json.dumps(value)}: must be a non-negative "
                    "integer"
                    + (" or an object of model -> non-negative integer" if name == "enqueued_tokens" else "")
                    + "."
                )
    return table


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
    """Build Settings from ``TIDAL_*`` variables (``os.environ`` by default), then overrides.

    Raises :class:`SettingsError` listing every bad variable at once (one start-up shows them all).
    """
    return _load(Settings, environ, overrides)


def load_scheduler_settings(environ: t.Mapping[str, str] | None = None) -> SchedulerSettings:
    """Only the ``TIDAL_SCHED_*`` variables, as the TidalScheduler plugin reads them inside vLLM."""
    return _load(SchedulerSettings, environ, {})


_Loaded = t.TypeVar("_Loaded", bound=SchedulerSettings)


def _load(cls: type[_Loaded], environ: t.Mapping[str, str] | None, overrides: dict[str, t.Any]) -> _Loaded:
    environ = os.environ if environ is None else environ
    values: dict[str, t.Any] = {}
    problems = []
    for f in dataclasses.fields(cls):
        name = env_name(f.name)
        raw = environ.get(name)
        if raw is not None and raw != "":
            try:
                values[f.name] = _coerce(raw, f.type)
            except ValueError:
                kind = "an integer" if f.type in (int, "int") else "a number"
                problems.append(f"{name}={raw!r}: must be {kind} (default {f.default!r}).")
    values.update(overrides)
    if problems:
        try:
            cls(**values)  # report the others too
        except SettingsError as exc:
            problems += exc.problems
        raise SettingsError(problems)
    return cls(**values)


def documented_fields() -> list[tuple[str, str, str, str]]:
    """(variable, default, accepted values, doc) rows for docs/configuration.md."""
    rows = []
    plugin = dataclasses.fields(SchedulerSettings)  # listed last, as the plugin's own group
    for f in [*(f for f in dataclasses.fields(Settings) if f not in plugin), *plugin]:
        default = f.default if f.default is not dataclasses.MISSING else "(computed)"
        rows.append((env_name(f.name), str(default), accepted(f), f.metadata["doc"]))
    return rows


def accepted(f: dataclasses.Field[t.Any]) -> str:
    """What a field's metadata admits, as the docs show it: ``≥ 1``, ``> 0, ≤ 1``, ``aimd, fixed``; else empty."""
    if "choices" in f.metadata:
        return ", ".join(f.metadata["choices"])
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    return ", ".join(f"{signs[key]} {f.metadata[key]:g}" for key in signs if key in f.metadata)


def child_environ(**overrides: str) -> dict[str, str]:
    """The environment for a child process Tidal starts (``tidal up``): ours plus overrides."""
    env = dict(os.environ)
    env.update({k: str(v) for k, v in overrides.items()})
    return env
