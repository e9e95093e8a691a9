"""Ops isolation (security review M3): finalize and the sweeps never wait behind ingests, and one tenant's ingests
never hold every ingest thread.

Real `tidal worker --ops` processes on the real broker. An ingest is held mid-attempt by construction, not by
timing: its input blob is a named pipe (FIFO) that nothing writes to, so its attempt (counted in SQL) blocks
opening it, holding its thread, until the test releases it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner
from sqlalchemy import func
from sqlalchemy import select

from config.celery import celery_config
from tests.support.wait import wait_for
from tests.support.worker_helpers import CHAT
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import open_for_writing
from tests.support.worker_helpers import spawn
from tests.support.worker_helpers import validating_batch
from tests.support.worker_helpers import validating_stored_batch
from tidal_api.cli.worker import worker
from tidal_workers import finalize
from tidal_workers.blobs import Written
from tidal_workers.ingest import request_ingest
from tidal_workers.store.models import Batch
from tidal_workers.store.models import BatchStatus
from tidal_workers.store.models import File
from tidal_workers.store.models import Item

LINES = 2


@pytest.fixture
def settings(settings):
    return settings.replace(ops_metrics_port=0, worker_metrics_port=0)


@pytest.fixture
def pipes(children):
    """The FIFOs a test holds ingests on; any still held at the end is closed (the ingest reads an empty file), so
    no worker is left blocked when ``children`` stops it."""
    made: list[Path] = []
    yield made
    for fifo in made:
        if fifo.exists() and not fifo.is_file() and (fd := open_for_writing(fifo)) is not None:
            os.close(fd)


def _data(tag: str) -> bytes:
    lines = (
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {"model": "m", "messages": [{"role": "user", "content": tag}]},
        }
        for i in range(LINES)
    )
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _held_batch(rt, pipes: list[Path], tenant: str) -> str:
    """A `validating` batch of ``tenant`` whose ingest, once sent, blocks opening its input until ``_release``."""
    rt.settings.blob_path.mkdir(parents=True, exist_ok=True)
    fifo = rt.settings.blob_path / f"held-{uuid.uuid4().hex}"
    os.mkfifo(fifo)
    pipes.append(fifo)
    return validating_stored_batch(rt, Written(fifo.name, 1 << 20, LINES), tenant=tenant)


def _release(rt, batch_id: str) -> None:
    """Let the ingest blocked on the batch's pipe go on: its first pass reads the lines through the pipe, its second
    reads a regular file of the same bytes, put in the pipe's place meanwhile."""
    with rt.store.read() as s:
        blob = s.scalar(select(File.blob).join(Batch, Batch.input_file_id == File.id).where(Batch.id == batch_id))
    fifo = rt.settings.blob_path / blob
    fd = wait_for(lambda: open_for_writing(fifo), 60, what=f"the ingest of {batch_id} to open its input")
    try:
        data = _data(batch_id)
        regular = fifo.with_name(fifo.name + "-regular")
        regular.write_bytes(data)
        os.replace(regular, fifo)
        os.write(fd, data)
    finally:
        os.close(fd)


def _running(rt, batch_id: str) -> bool:
    """An ingest attempt of the batch has begun and not ended."""
    b = batch_row(rt, batch_id)
    return b.status == BatchStatus.validating.value and b.ingest_started_at is not None


def _ingested(rt, batch_id: str) -> bool:
    with rt.store.read() as s:
        items = s.scalar(select(func.count()).select_from(Item).where(Item.batch_id == batch_id))
    return batch_row(rt, batch_id).status == BatchStatus.in_progress.value and items == LINES


def test_finalize_and_a_sweep_run_while_ingests_hold_every_ingest_thread(
    rt, settings, make_batch, children, pipes, tmp_path
):
    s = settings.replace(ingest_worker_threads=2, ops_worker_threads=1)
    log = tmp_path / "ops.log"
    ops = spawn(s, "worker", "--ops", "--loglevel=info", log=log)
    children.append(ops)
    wait_for(lambda: log.read_text().count(" ready.") >= 2 or ops.poll() is not None, 120, "both parts to start")
    assert ops.poll() is None, log.read_text()[-3000:]
    # Two processes (Celery retitles each: "[celeryd: tidal-ops@...] ... --part=control)")
    titles = [" ".join(p.cmdline()) for p in psutil.Process(ops.pid).children()]
    parts = {part for part in ("control", "ingest") for title in titles if f"--part={part}" in title}
    assert len(titles) == 2 and parts == {"control", "ingest"}, titles

    # Two tenants' ingests (one each: TIDAL_INGESTS_PER_TENANT) take both ingest threads; acme's second waits.
    acme = [_held_batch(rt, pipes, "acme") for _ in range(2)]
    globex = _held_batch(rt, pipes, "globex")
    for batch_id in [*acme, globex]:
        request_ingest(rt, batch_id)
    wait_for(lambda: _running(rt, globex) and any(_running(rt, b) for b in acme), 60, "both ingest threads held")
    (running,) = [b for b in acme if _running(rt, b)]
    (waiting,) = set(acme) - {running}

    cancelling = make_batch(2)
    with rt.store.transaction() as session:
        session.get(Batch, cancelling).status = BatchStatus.cancelling.value
    finalize.request_finalize(rt, cancelling)  # as an item task sends it
    expiring = make_batch(1, expires_in=0)
    sweep = celery_config(s)["beat_schedule"]["tidal-expire"]
    rt.celery.send_task(sweep["task"], **sweep["options"])  # as beat sends it: expires after its period
    wait_for(lambda: batch_row(rt, cancelling).status == BatchStatus.cancelled.value, 30, "the finalize")
    wait_for(lambda: batch_row(rt, expiring).status == BatchStatus.expired.value, 30, "the expiry sweep")
    assert _running(rt, running) and _running(rt, globex)  # done while both ingests still held their threads
    assert batch_row(rt, waiting).ingest_attempts == 0

    for batch_id in (running, globex):
        _release(rt, batch_id)
    wait_for(lambda: _running(rt, waiting), 60, "acme's second ingest, sent when its first ended")
    _release(rt, waiting)
    wait_for(lambda: all(_ingested(rt, b) for b in [*acme, globex]), 60, "every ingest to finish")
    text = log.read_text()
    assert ".> tidal.ops " in text and ".> tidal.ingest " in text  # each part's Celery banner: its one queue
    assert text.count("Task tidal.ingest[") >= 3 and "Task tidal.finalize[" in text


def test_one_tenants_ingests_wait_their_turn_and_leave_threads_to_others(rt, settings, children, pipes, tmp_path):
    """Three threads, two ingests per tenant: acme's third batch waits (no attempt counted, no thread held) while
    globex's is ingested; it starts when one of acme's ends, and every batch is ingested once."""
    s = settings.replace(ingest_worker_threads=3, ingests_per_tenant=2)
    log = tmp_path / "ingest.log"
    children.append(spawn(s, "worker", "--ops", "--part=ingest", "--loglevel=info", log=log))
    acme = [_held_batch(rt, pipes, "acme") for _ in range(3)]
    globex = validating_batch(rt, _data("globex"), tenant="globex")
    for batch_id in [*acme, globex]:
        request_ingest(rt, batch_id)

    wait_for(lambda: _ingested(rt, globex), 120, "globex's ingest, beside acme's two")
    running = [b for b in acme if _running(rt, b)]
    (waiting,) = set(acme) - set(running)
    assert len(running) == 2 and batch_row(rt, waiting).ingest_attempts == 0  # it waits in SQL, holding no thread

    _release(rt, running[0])
    wait_for(lambda: _running(rt, waiting), 60, "acme's third ingest, sent when one of its others ended")
    for batch_id in (running[1], waiting):
        _release(rt, batch_id)
    wait_for(lambda: all(_ingested(rt, batch_id) for batch_id in acme), 60, "every acme ingest to finish")
    assert [batch_row(rt, batch_id).ingest_attempts for batch_id in [*acme, globex]] == [1, 1, 1, 1]


def test_when_one_part_dies_the_ops_worker_stops_the_other_and_exits_non_zero(settings, children, tmp_path):
    """One command, one unit: its supervisor (compose, systemd, `tidal up`) restarts both parts, as it restarted
    one process before."""
    log = tmp_path / "ops.log"
    ops = spawn(settings, "worker", "--ops", "--loglevel=info", log=log)
    children.append(ops)
    wait_for(lambda: log.read_text().count(" ready.") >= 2 or ops.poll() is not None, 120, "both parts to start")
    parts = {"--part=ingest" in " ".join(p.cmdline()): p for p in psutil.Process(ops.pid).children()}
    parts[True].kill()  # the ingest part, as the kernel's OOM killer would
    assert ops.wait(30) == 1
    assert not parts[False].is_running() or parts[False].status() == psutil.STATUS_ZOMBIE
    assert "the ops worker's ingest part exited with status -9: stopping the other" in log.read_text()


@pytest.mark.parametrize(
    "args, says",
    [
        (["--part=ingest"], "--part selects a part of the ops worker: give --ops too"),
        (["--ops", "--threads=4"], "with --ops give --part too"),
    ],
)
def test_worker_options_that_do_not_go_together_are_refused(args, says):
    result = CliRunner().invoke(worker, args)
    assert result.exit_code == 2 and says in result.output, result.output
