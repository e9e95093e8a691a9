"""The engines a benchmark measures: started here (the GPU-timed twin, or the CPU engine's tiny / dense model)
or given by URL, each described by what the harvest needs to know about it (slots, budget, tokenizer, flags).

Every twin started here writes its step trace beside its log (``trace_path``), so each benchmark window can report
the steps the twin could not pace (step_trace.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import typing as t
from pathlib import Path

from config import Settings
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import free_port
from tidal_engine.serve import scheduler_env
from tidal_engine.serve import start_engine
from tidal_engine.twin import DEFAULT_PROFILE

CPU_KINDS = ("tiny", "dense")  # the CPU engine computing for real: a step's time is this machine's
KINDS = ("twin", *CPU_KINDS)


@dataclasses.dataclass(frozen=True)
class BenchEngine:
    url: str
    model: str  # the name clients send
    tokenizer: str  # directory (or name) of the served model's tokenizer
    max_num_seqs: int  # the engine's slots: the ceiling fills all of them
    budget_tokens: int  # max_num_batched_tokens (τ)
    flags: tuple[str, ...]  # how it was started (`vllm serve` argv), or "external"
    plugin_metrics_url: str | None = None  # TidalScheduler's /metrics when it runs the plugin
    profile: str | None = None  # the twin's GPU profile
    trace_path: Path | None = None  # the twin's step trace (step_trace.py)

    def provenance(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EngineRequest:
    """What to start: ``kind`` twin / tiny / dense, with or without TidalScheduler."""

    kind: str
    profile: str | None
    max_num_seqs: int  # 0: the profile's (twin) or 16 (CPU)
    kv_bytes: str = "64M"  # the CPU engine's KV pool
    budget_tokens: int = 2048


@contextlib.contextmanager
def started(
    request: EngineRequest, settings: Settings, *, plugin: bool, log_path: Path, env: dict[str, str] | None = None
) -> t.Iterator[BenchEngine]:
    """Start the engine (``env`` added to its environment: a core to bind), yield its description, stop it on
    exit."""
    engine_settings = settings
    metrics_url = None
    trace_path = log_path.with_name(f"{log_path.stem}.steps.csv") if request.kind == "twin" else None
    if trace_path is not None:
        trace_path.unlink(missing_ok=True)  # rows of an earlier engine would fall into this one's windows
    if plugin:
        port = free_port()
        engine_settings = settings.replace(sched_metrics_port=port)
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    options = (
        _twin_options(request, engine_settings, plugin, trace_path)
        if request.kind == "twin"
        else _cpu_options(request, engine_settings, plugin)
    )
    engine = start_engine(options, log_path=log_path, env={**scheduler_env(engine_settings), **(env or {})})
    try:
        yield BenchEngine(
            url=engine.url,
            model=options.served_model_name or options.model,
            tokenizer=options.model,
            max_num_seqs=options.max_num_seqs or 0,
            budget_tokens=options.max_num_batched_tokens,
            flags=tuple(options.argv(int(engine.url.rsplit(":", 1)[1]))[1:]),
            plugin_metrics_url=metrics_url,
            profile=request.profile,
            trace_path=trace_path,
        )
    finally:
        engine.stop()


def _cpu_options(request: EngineRequest, settings: Settings, plugin: bool) -> EngineOptions:
    from tidal_engine.tiny import build_tiny

    return EngineOptions(
        model=str(build_tiny(settings.home, request.kind)),
        served_model_name=request.kind,
        tidal_scheduler=plugin,
        max_num_seqs=request.max_num_seqs or 16,
        kv_cache_bytes=request.kv_bytes,
        max_num_batched_tokens=request.budget_tokens,
    )


def _twin_options(request: EngineRequest, settings: Settings, plugin: bool, trace_path: Path | None) -> EngineOptions:
    """The GPU-timed twin of ``request.profile``: slots, τ and KV pool are the profile's GPU's (docs/engine.md)."""
    from tidal_engine.serve import twin_options

    return twin_options(
        settings,
        request.profile or DEFAULT_PROFILE,
        tidal_scheduler=plugin,
        max_num_seqs=request.max_num_seqs or None,
        trace_path=trace_path,
    )


def external(
    url: str, model: str, tokenizer: str, max_num_seqs: int, budget_tokens: int, plugin_metrics_url: str | None
) -> BenchEngine:
    """An engine someone else started (a GPU host): what it is must be said on the command line."""
    if not (model and tokenizer and max_num_seqs):
        raise ValueError("an engine given by URL needs --model, --tokenizer and --max-num-seqs")
    return BenchEngine(url, model, tokenizer, max_num_seqs, budget_tokens, ("external",), plugin_metrics_url)
