"""`tidal worker` (a Celery worker next to one vLLM) and `tidal beat` (the sweeps' one scheduler)."""

import click

from config import load_settings


@click.command()
@click.option("--loglevel", default="info", show_default=True)
@click.option("--threads", type=int, default=None, help="Pool threads. Default: TIDAL_WORKER_THREADS.")
def worker(loglevel: str, threads: int | None) -> None:
    """Run a worker: its claim thread feeds TIDAL_VLLM_URL; it consumes its own queue and tidal.ops."""
    from tidal_workers.celery_app import make_celery
    from tidal_workers.task_names import OPS_QUEUE

    settings = load_settings()
    app = make_celery(settings)
    # Threads pool: the tasks are HTTP calls, and they share the claim thread's lease book.
    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={threads or settings.worker_threads}",
            f"--hostname=tidal@{settings.node}",
            f"--queues={OPS_QUEUE}",
            f"--loglevel={loglevel}",
            "--without-mingle",
            "--without-gossip",
        ]
    )


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
        prepare_storage(rt, "beat")  # like every Tidal process: only on the fleet's storage
    finally:
        rt.close()
    sending_app(settings).start(["beat", "--scheduler=redbeat.RedBeatScheduler", f"--loglevel={loglevel}"])


COMMANDS = [worker, beat]
