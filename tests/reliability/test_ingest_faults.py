"""The OOM-on-ingest scenario: an input whose ingest kills its process, again and again.

The ops worker (`tidal worker --ops`, whose ingest part runs the attempt) is killed with kill -9 in the middle of
each ingest attempt, and restarted as its supervisor would. The kill lands mid-ingest by construction, not by
timing: the batch's input blob is a named pipe (FIFO), so an attempt that has opened it and read its first lines is
blocked reading the rest until the test kills it. Beat (its reconcile resends the ingest with backoff) and a GPU
node's worker run all along. The batch ends `failed` with `ingest_failed` after the last attempt, and no ingest ever
ran on the GPU node's worker.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from tests.support.fault_helpers import spawn_tidal
from tests.support.fault_helpers import start_worker
from tests.support.wait import wait_for
from tests.support.worker_helpers import CHAT
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import on_stub
from tests.support.worker_helpers import open_for_writing
from tests.support.worker_helpers import settled
from tests.support.worker_helpers import validating_batch
from tests.support.worker_helpers import validating_stored_batch
from tidal_api.cli.services import kill_group
from tidal_workers.blobs import Written
from tidal_workers.ingest import request_ingest

NODE = "gpu-node"
OPS = "control"


@pytest.fixture
def settings(settings, stub):
    return on_stub(
        settings,
        stub,
        claim_idle_seconds=0.02,
        reconcile_seconds=0.5,  # beat's reconcile: the resends, and the verdict after the last attempt
        ingest_resend_seconds=2.0,  # an attempt presumed dead 2 s after it began, then 4 s, then 8 s
        beat_lock_seconds=2,
    )


def _request(custom_id: str) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": custom_id}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}).encode() + b"\n"


def _holders(path: Path) -> set[int]:
    """Processes other than this one with ``path`` open."""
    found = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                found.add(int(fd_dir.parent.name))
        except OSError:  # a process that exited, or one we may not look into
            continue
    return found - {os.getpid()}


def _ingest_part(ops) -> int:
    """The pid of the ops worker's ingest part (`tidal worker --ops --part=ingest`, a child of ``ops``)."""
    (part,) = [p.pid for p in psutil.Process(ops.pid).children() if "--part=ingest" in " ".join(p.cmdline())]
    return part


@pytest.mark.slow
def test_an_input_that_kills_the_ingesting_process_fails_its_batch_after_the_last_attempt(
    rt, settings, children, tmp_path
):
    attempts = settings.ingest_attempts
    fifo = settings.blob_path / "input-that-kills"
    settings.blob_path.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    batch_id = validating_stored_batch(rt, Written(fifo.name, 64 << 20, 50_000))
    gpu = start_worker(settings, NODE, tmp_path)
    children.append(gpu)
    children.append(spawn_tidal(settings, "beat", "--loglevel=info", log=tmp_path / "beat.log"))
    request_ingest(rt, batch_id)  # what POST /v1/batches sends for a large file

    counted = [0]  # attempts counted in SQL at each kill
    while counted[-1] < attempts:
        ops = start_worker(settings, OPS, tmp_path, ops=True)
        children.append(ops)
        fd = wait_for(lambda: open_for_writing(fifo), 120, what=f"ingest attempt {counted[-1] + 1} to open its input")
        try:
            os.write(fd, b"".join(_request(f"r{i}") for i in range(8)))  # it reads these, then waits for more
            # The reader's open() returns once a writer appears: wait for its descriptor, then name its process.
            holders = wait_for(lambda: _holders(fifo), 30, what="the reading process to hold the input open")
            assert holders == {_ingest_part(ops)}, "the ingest attempt runs on the ops worker's ingest part only"
            b = batch_row(rt, batch_id)
            assert b.status == "validating" and b.ingest_attempts > counted[-1]  # counted before the work began
            counted.append(b.ingest_attempts)
            kill_group(ops)  # mid-ingest: as the kernel's OOM killer would
        finally:
            os.close(fd)
    # One kill per attempt, unless the machine was slow enough for a resend to start a second attempt in the
    # same process before the kill (the attempt looked dead); either way every attempt died mid-ingest.
    assert counted[-1] == attempts and len(counted) - 1 <= attempts

    ops = start_worker(settings, OPS, tmp_path, ops=True)  # the supervisor restarts it once more
    children.append(ops)
    b, out, err = settled(rt, batch_id, ("failed",), timeout=120)
    assert (b.ingest_attempts, b.total, out, err) == (attempts, 0, [], [])
    assert b.errors == [
        {
            "code": "ingest_failed",
            "line": None,
            "param": None,
            "message": f"The input file could not be validated: {attempts} attempts failed; the last stopped before "
            "it finished (its process died: killed, or out of memory).",
        }
    ]
    assert _holders(fifo) == set()

    ops_log = (tmp_path / f"ops-{OPS}.log").read_text()
    gpu_log = (tmp_path / f"worker-{NODE}.log").read_text()
    assert ops_log.count("Task tidal.ingest[") >= attempts and ".> tidal.ingest " in ops_log
    # The GPU node's worker does not even consume the ops queues (Celery's banner lists what it consumes).
    assert ".> tidal.ops " not in gpu_log and ".> tidal.ingest " not in gpu_log, gpu_log[-3000:]
    assert ".> tidal@gpu-node.dq2 " in gpu_log, gpu_log[-3000:]
    assert "Task tidal.ingest[" not in gpu_log and "Task tidal.sweep" not in gpu_log, gpu_log[-3000:]

    # The fleet is unharmed: the next batch is ingested by the ops worker and run by the GPU node's worker.
    good = validating_batch(rt, _request("ok-1") + _request("ok-2"))
    request_ingest(rt, good)
    b, out, err = settled(rt, good, timeout=120)
    assert (b.completed, len(out), err) == (2, 2, [])
    assert "Task tidal.ingest[" not in (tmp_path / f"worker-{NODE}.log").read_text()
    assert time.time() < b.expires_at
