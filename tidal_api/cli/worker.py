"""`tidal worker` (a Celery worker next to one vLLM), `tidal worker --ops` (ingest and the sweeps) and `tidal beat`
(the sweeps' one scheduler)."""

import click

from config import Settings
from config import load_settings


def worker_argv(settings: Settings, ops: bool, loglevel: str, threads: int | None) -> list[str]:
    """Celery's worker arguments: a GPU node's worker excludes ``tidal.ops``, an ops worker consumes only it."""
    from config.celery import GPU_WORKER_EXCLUDED_QUEUES
    from config.celery import OPS_WORKER_QUEUES

    if ops:
        name, pool = f"tidal-ops@{settings.node}", threads or settings.ops_worker_threads
        queues = f"--queues={','.join(OPS_WORKER_QUEUES)}"
    else:
        from tidal_workers.gate import pool_threads

        name, pool = f"tidal@{settings.node}", threads or pool_threads(settings)
        queues = f"--exclude-queues={','.join(GPU_WORKER_EXCLUDED_QUEUES)}"
    # Threads pool: a GPU node's tasks are HTTP calls sharing the claim thread's lease book; an ops worker's are
    # SQL and storage I/O.
    return [
        "worker",
        "--pool=threads",
        f"--concurrency={pool}",
        f"--hostname={name}",
        queues,
        f"--loglevel={loglevel}",
        "--without-mingle",
        "--without-gossip",
    ]


@click.command()
@click.option("--loglevel", default="info", show_default=True)
@click.option(
    "--threads",
    type=int,
    default=None,
    help="Pool threads. Default: TIDAL_WORKER_THREADS (--ops: TIDAL_OPS_WORKER_THREADS).",
)
@click.option(
    "--ops",
    is_flag=True,
    help="Run the ops worker instead: ingest and beat's sweeps (the tidal.ops queue), no engine, no claiming.",
)
def worker(loglevel: str, threads: int | None, ops: bool) -> None:
    """Run a GPU node's worker (its claim thread feeds TIDAL_VLLM_URL; it consumes only its own queue), or with
    --ops the ops worker (ingest and the sweeps; at least one per deployment, on any host)."""
    from tidal_workers.celery_app import make_celery

    settings = load_settings()
    make_celery(settings, ops=ops).worker_main(worker_argv(settings, ops, loglevel, threads))


@click.command()
@click.option("--loglevel", default="info", show_default=True)
def beat(loglevel: str) -> None:
    """Run celery beat with RedBeat: several may run, only the lock holder fires (beat only sends: no worker code)."""
    from config.celery import sending_app
    from tidal_workers.blobs.sentinel import prepare_storage
    from tidal_workers.runtime import Runtime

    settings = load_settings()
    rt = Runtime(settings)
    try:
        # Like every Tidal process: only on the fleet's storage.
        prepare_storage(rt.blobs, rt.redis, "beat", settings.node)
    finally:
        rt.close()
    sending_app(settings).start(["beat", "--scheduler=redbeat.RedBeatScheduler", f"--loglevel={loglevel}"])


COMMANDS = [worker, beat]
