"""Every long-running `tidal` command exits cleanly on SIGTERM within its grace period (compose's default, 10 s), as
any supervisor stops it: `serve`, `worker --ops`, `beat`, and a GPU node's `worker`, which finishes the request under
way and hands back at once what it has not sent (here: an item waiting out a 30 s retry backoff)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
import requests

from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import file_lines
from tests.support.worker_helpers import queued
from tests.support.worker_helpers import spawn
from tidal_engine.serve import free_port

GRACE_S = 10.0


def _stop(proc: subprocess.Popen) -> float:
    """SIGTERM, as systemd, a container runtime or `timeout` sends it; the seconds until the process exited 0."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(GRACE_S) == 0
    return time.monotonic() - began


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.parametrize(
    "args, ready",
    [
        (("worker", "--ops", "--loglevel=info"), " ready."),
        (("beat", "--loglevel=info"), "beat: Starting"),
        (("serve",), None),
    ],
    ids=["ops", "beat", "serve"],
)
def test_a_long_running_command_exits_cleanly_on_sigterm(rt, settings, children, tmp_path, args, ready):
    s = settings.replace(bind=f"127.0.0.1:{free_port()}", ops_metrics_port=0)
    log = tmp_path / "out.log"
    proc = spawn(s, *args, log=log)
    children.append(proc)
    if ready is None:
        wait_for(lambda: _answers(f"http://{s.bind}/openapi.json") or proc.poll() is not None, 120, "the API")
    else:
        wait_for(lambda: ready in log.read_text() or proc.poll() is not None, 120, f"{args[0]} to start")
    assert proc.poll() is None, log.read_text()[-3000:]
    _stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def test_a_gpu_worker_finishes_what_is_under_way_and_hands_back_the_rest(
    rt, make_batch, stub, settings, children, tmp_path
):
    stub.delay = 3.0  # the request under way when SIGTERM comes
    s = settings.replace(
        node="stopping", retry_backoff_seconds=60.0, retry_budget=3, request_timeout_seconds=30.0, lease_seconds=30.0
    )
    batch = make_batch(2)
    stub.script("b0-1", "503")  # /health answers: the item's own error, then a 60 s backoff
    log = tmp_path / "worker.log"
    proc = spawn(s, "worker", "--loglevel=info", log=log)
    children.append(proc)
    wait_for(
        lambda: "; retry 1 in 30.00s" in log.read_text() and stub.seen("b0-0") == 1, 120, "one sent, one in backoff"
    )
    took = _stop(proc)
    b = batch_row(rt, batch)
    assert (b.completed, b.failed) == (1, 0)  # the request under way finished and was recorded
    assert (
        queued(rt, batch) == 1 and rt.queue.inflight("stopping") == 0
    )  # the other went back, not waiting out its 30 s
    assert file_lines(rt, b.error_file_id) == []
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    print(f"\nSIGTERM → exited in {took:.1f} s (request under way 3 s, backoff 30 s)")
