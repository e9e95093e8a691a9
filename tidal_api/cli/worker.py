"""`tidal worker` (a Celery worker next to one vLLM), `tidal worker --ops` (finalize, the sweeps and ingest) and
`tidal beat` (the sweeps' one scheduler)."""

import sys
import time

import click

from config import Settings
from config import load_settings
from config.celery import GPU_WORKER_EXCLUDED_QUEUES
from config.celery import OPS_CONTROL
from config.celery import OPS_PART_QUEUES
from config.settings import child_environ
from tidal_api.cli.supervise import Stop
from tidal_api.cli.supervise import Supervisor
from tidal_api.cli.supervise import stop_on_signals

OPS_STOP_GRACE_S = 10.0  # compose's default stop timeout: a longer ingest is killed, and its attempt is resent


def worker_argv(settings: Settings, ops_part: str | None, loglevel: str, threads: int | None) -> list[str]:
    """Celery's worker arguments: a GPU node's worker excludes the ops queues, an ops worker's part consumes only
    its own."""
    if ops_part is None:
        from tidal_workers.gate import pool_threads

        name, pool = f"tidal@{settings.node}", threads or pool_threads(settings)
        queues = f"--exclude-queues={','.join(GPU_WORKER_EXCLUDED_QUEUES)}"
    else:
        control = ops_part == OPS_CONTROL
        name = f"tidal-{'ops' if control else 'ingest'}@{settings.node}"
        pool = threads or (settings.ops_worker_threads if control else settings.ingest_worker_threads)
        queues = f"--queues={','.join(OPS_PART_QUEUES[ops_part])}"
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


def run_ops_parts(loglevel: str) -> int:
    """Run each part of the ops worker as a child `tidal worker --ops --part PART` until a stop signal (then 0) or
    until one part exits (then the other is stopped too, and its status is returned: the whole ops worker is
    restarted by its own supervisor, as one process was)."""
    stop_on_signals()
    sup = Supervisor(child_environ(), log_dir=None)
    command = [sys.executable, "-m", "tidal_api.cli", "worker", "--ops", f"--loglevel={loglevel}"]
    try:
        for part in OPS_PART_QUEUES:
            sup.start(part, [*command, f"--part={part}"])
        while (exited := sup.first_exited()) is None:
            time.sleep(0.5)
        part, status = exited
        click.echo(f"the ops worker's {part} part exited with status {status}: stopping the other", err=True)
        return status if status > 0 else 1  # a part that stops on its own is a failure, whatever its status
    except Stop:
        return 0
    finally:
        sup.stop(OPS_STOP_GRACE_S)


@click.command()
@click.option("--loglevel", default="info", show_default=True)
@click.option(
    "--threads",
    type=int,
    default=None,
    help="Pool threads. Default: TIDAL_WORKER_THREADS (--ops --part control: TIDAL_OPS_WORKER_THREADS, "
    "--ops --part ingest: TIDAL_INGEST_WORKER_THREADS).",
)
@click.option(
    "--ops",
    is_flag=True,
    help="Run the ops worker instead: finalize and beat's sweeps (the tidal.ops queue) and ingest (tidal.ingest), "
    "each part a Celery worker process with its own threads; no engine, no claiming.",
)
@click.option(
    "--part",
    type=click.Choice(list(OPS_PART_QUEUES)),
    default=None,
    help="With --ops: run only this part, in this process (--ops alone runs both, as child processes).",
)
def worker(loglevel: str, threads: int | None, ops: bool, part: str | None) -> None:
    """Run a GPU node's worker (its claim thread feeds TIDAL_VLLM_URL; it consumes only its own queue), or with
    --ops the ops worker (finalize, the sweeps and ingest; at least one per deployment, on any host)."""
    if part is not None and not ops:
        raise click.UsageError("--part selects a part of the ops worker: give --ops too")
    if ops and part is None:
        if threads is not None:
            raise click.UsageError(
                "--threads sets one process's pool: with --ops give --part too, or set TIDAL_OPS_WORKER_THREADS "
                "and TIDAL_INGEST_WORKER_THREADS"
            )
        load_settings()  # a bad setting stops here, once, not in each part
        raise SystemExit(run_ops_parts(loglevel))
    from tidal_workers.celery_app import make_celery

    settings = load_settings()
    make_celery(settings, part).worker_main(worker_argv(settings, part, loglevel, threads))


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
