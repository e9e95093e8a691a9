"""Start a stock ``vllm serve`` as a child process and wait until it is healthy.

One function serves both hosts: on this CPU build it adds the fast-start test
flags (float32, eager, an explicit KV size; docs/engine.md explains each); on a
GPU host the same call with ``cpu=False`` and a real model name runs the stock
``vllm`` with only the flags Tidal needs (priority scheduling, the plugin).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

import requests

from config import SchedulerSettings
from config import Settings
from config.settings import child_environ
from config.settings import env_name

# The plugin and the engine's scheduling mode go together: vLLM only warns when a Scheduler subclass runs with
# async scheduling on (and the CPU platform has only sync scheduling), so each class is passed with its flag.
SCHEDULER_CLS = "tidal_engine.scheduler.TidalScheduler"  # with --no-async-scheduling: proven on CPU and GPU-timed twin
ASYNC_SCHEDULER_CLS = "tidal_engine.scheduler.TidalAsyncScheduler"  # with --async-scheduling: GPU builds only
# The hub is unreachable here, and usage reports would only hang.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    model: str  # a local directory or, on a GPU host, a model name
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    tidal_scheduler: bool = False  # load the plugin through --scheduler-cls
    async_scheduling: bool = False  # GPU: vLLM's async scheduling with TidalAsyncScheduler (not proven on an engine)
    cpu: bool = True  # add the CPU build's fast-start flags
    kv_cache_bytes: str | None = "64M"  # always set on CPU: the default can fail the memory check
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    extra_args: tuple[str, ...] = ()
    model_in_engine_core: bool = False  # the timed twin: see ``process_env``

    def __post_init__(self) -> None:
        if self.async_scheduling and (self.cpu or not self.tidal_scheduler):
            raise ValueError("async scheduling is for the plugin on a GPU host: vLLM's CPU platform has none")

    def argv(self, port: int) -> list[str]:
        vllm = str(Path(sys.executable).with_name("vllm"))
        args = [
            vllm,
            "serve",
            self.model,
            "--host",
            self.host,
            "--port",
            str(port),
            "--scheduling-policy",
            "priority",
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--max-model-len",
            str(self.max_model_len),
        ]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.cpu:
            # float32 with eager mode: bf16 + eager + an explicit KV size dies
            # with SIGILL on 1-2 token prompts (docs/engine.md, pitfalls).
            args += ["--dtype", "float32", "--enforce-eager"]
        if self.kv_cache_bytes:
            args += ["--kv-cache-memory-bytes", self.kv_cache_bytes]
        if self.max_num_seqs:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.async_scheduling:
            args += ["--scheduler-cls", ASYNC_SCHEDULER_CLS, "--async-scheduling"]
        elif self.tidal_scheduler:
            args += ["--scheduler-cls", SCHEDULER_CLS, "--no-async-scheduling"]
        return args + list(self.extra_args)

    def process_env(self) -> dict[str, str]:
        """Variables the engine's processes need whoever starts it (the CLI, a test, a benchmark).

        The timed twin (``model_in_engine_core``) runs its model inside the engine-core process. By default the
        CPU platform runs the model in a separate worker process, and vLLM's shared-memory queue between the two
        busy-polls (``sched_yield``) for a second after each message: while the twin sleeps out a step the engine
        core would spin most of a core waiting for the worker's answer. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps
        ``vllm serve``'s API server and engine-core processes and runs the model inside the engine core (vLLM's
        ``UniProcExecutor``, as on a single GPU), which then sleeps while the twin waits. One OpenMP thread: the
        tiny forward has nothing to split, and on a busy machine a parallel region waits at its barrier for
        whichever thread was descheduled.
        """
        if self.model_in_engine_core:
            return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
        return {}


@dataclasses.dataclass
class Engine:
    """A running vLLM server; ``stop()`` ends it and its engine-core child."""

    url: str
    process: subprocess.Popen
    log_path: Path
    started_s: float  # seconds from spawn to a healthy /health

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        # The server runs in its own session: signal the whole group so the
        # engine-core process goes too.
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout_s)


def scheduler_env(settings: SchedulerSettings) -> dict[str, str]:
    """TidalScheduler's settings as the ``TIDAL_SCHED_*`` variables its process will read."""
    return {env_name(f.name): str(getattr(settings, f.name)) for f in dataclasses.fields(SchedulerSettings)}


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> t.Callable[[], None] | None:
    """A ``preexec_fn`` for a supervised child: the kernel sends it SIGTERM when this process dies, even by SIGKILL.

    The child then runs its own shutdown (vLLM stops its engine core, gunicorn its workers). If this process
    died between the fork and the call taking effect, the child ends at once rather than run unsupervised.
    Linux ties the signal to the *thread* that forks, not the process: from any thread but the main one the
    child would die when that thread exits (a pool's thread, a restart thread), so there it is not set (None).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def in_child() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


class EngineStartError(RuntimeError):
    pass


def freeze_connector_args(storage: Path) -> tuple[str, ...]:
    """``vllm serve`` flags that load TidalFreezeConnector (``tidal_engine.freeze``) over ``storage``."""
    config = {
        "kv_connector": "TidalFreezeConnector",
        "kv_connector_module_path": "tidal_engine.freeze",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }
    return ("--kv-transfer-config", json.dumps(config))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_engine(
    options: EngineOptions, *, log_path: Path, env: dict[str, str] | None = None, timeout_s: float = 240.0
) -> Engine:
    """Spawn ``vllm serve`` and return once ``/health`` answers 200.

    The engine's processes inherit the environment plus ``options.process_env()`` and ``env`` (TidalScheduler's
    ``TIDAL_SCHED_*`` settings travel this way into the engine-core process).
    """
    port = options.port or free_port(options.host)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    started = time.monotonic()
    process = subprocess.Popen(
        options.argv(port),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=child_environ(**OFFLINE_ENV, **options.process_env(), **(env or {})),
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    log.close()
    engine = Engine(f"http://{options.host}:{port}", process, log_path, 0.0)
    try:
        _wait_healthy(engine, started + timeout_s)
    except BaseException:
        engine.stop()
        raise
    engine.started_s = time.monotonic() - started
    return engine


def _wait_healthy(engine: Engine, deadline: float) -> None:
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise EngineStartError(f"vllm exited with {engine.process.returncode}; log tail:\n{_tail(engine.log_path)}")
        try:
            if requests.get(engine.url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise EngineStartError(f"vllm not healthy at {engine.url} in time; log tail:\n{_tail(engine.log_path)}")


def _tail(path: Path, num_bytes: int = 4000) -> str:
    data = path.read_bytes()
    return data[-num_bytes:].decode(errors="replace")


def start_tiny(
    settings: Settings,
    *,
    log_path: Path,
    tidal_scheduler: bool = False,
    max_num_seqs: int | None = None,
    shape: str = "tiny",
    kv_cache_bytes: str = "64M",
) -> Engine:
    """A local model of ``shape`` (built under TIDAL_HOME on first use) served under that name on a free port.

    TidalScheduler's ``TIDAL_SCHED_*`` settings travel with it, so ``tidal up --demo``
    and ``tidal bench`` run the engine a GPU host would, only smaller.
    """
    from tidal_engine.tiny import build_tiny

    options = EngineOptions(
        model=str(build_tiny(settings.home, shape)),
        served_model_name=shape,
        tidal_scheduler=tidal_scheduler,
        max_num_seqs=max_num_seqs,
        kv_cache_bytes=kv_cache_bytes,
    )
    return start_engine(options, log_path=log_path, env=scheduler_env(settings))


def twin_options(
    settings: Settings,
    profile: str,
    *,
    tidal_scheduler: bool = False,
    trace_path: Path | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int = 8192,
    kv_pool_tokens: int | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_args: tuple[str, ...] = (),
) -> EngineOptions:
    """The timed twin's ``vllm serve``: the twin model under the profile's name, sized like the profile's GPU.

    Its KV pool holds as many tokens as the GPU's (docs/engine.md), its slots and token budget are the GPU's
    (``max_num_seqs`` overrides the slots, ``kv_pool_tokens`` the pool: a test that needs KV pressure); the
    profile and the step trace reach the model class through ``--hf-overrides``.
    """
    from tidal_engine.tiny import build_tiny
    from tidal_engine.tiny import kv_bytes_per_token
    from tidal_engine.twin import load_profile

    spec = load_profile(profile)
    overrides = {"tidal_twin_profile": spec.name, "tidal_twin_trace": str(trace_path or "")}
    return EngineOptions(
        model=str(build_tiny(settings.home, "twin")),
        served_model_name=spec.name,
        host=host,
        port=port,
        tidal_scheduler=tidal_scheduler,
        kv_cache_bytes=str((kv_pool_tokens or spec.kv_pool_tokens) * kv_bytes_per_token("twin")),
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs or spec.max_num_seqs,
        extra_args=("--hf-overrides", json.dumps(overrides), *extra_args),
        model_in_engine_core=True,
    )


def start_twin(
    settings: Settings,
    profile: str,
    *,
    log_path: Path,
    tidal_scheduler: bool = False,
    trace_path: Path | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int = 8192,
    kv_pool_tokens: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> Engine:
    """The timed twin of ``profile`` (MODEL@GPU, ``twin_profiles.toml``) on a free port, served as that name.

    Like ``start_tiny``, TidalScheduler's ``TIDAL_SCHED_*`` settings travel with it; unless they name a profile,
    the plugin prices a relative budget on the twin's own (``TIDAL_SCHED_PROFILE``).
    """
    options = twin_options(
        settings,
        profile,
        tidal_scheduler=tidal_scheduler,
        trace_path=trace_path,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        kv_pool_tokens=kv_pool_tokens,
        extra_args=extra_args,
    )
    return start_engine(options, log_path=log_path, env=twin_scheduler_env(settings, profile))


def twin_scheduler_env(settings: SchedulerSettings, profile: str) -> dict[str, str]:
    """TidalScheduler's settings for a twin of ``profile``: unless they name a profile, the relative budget prices
    steps with the twin's own (its knee is what a small α buys; the rolling linear fit has none)."""
    if not settings.sched_profile:
        settings = dataclasses.replace(settings, sched_profile=profile)
    return scheduler_env(settings)
