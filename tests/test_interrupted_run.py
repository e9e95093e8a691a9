"""A test run stopped by SIGTERM (tests/run.sh's trap stops the soaks so) still stops the children its fixtures
started: tests/support/interrupt.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import alive
from tests.support.wait import wait_for

INNER = """
import subprocess, pytest
from pathlib import Path

@pytest.fixture
def child(tmp_path):
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()
    Path({done!r}).write_text("torn down")

def test_waits(child):
    Path({pid!r}).write_text(str(child.pid))
    import time
    time.sleep(300)
"""


def test_sigterm_tears_the_fixtures_down_and_stops_their_children(tmp_path):
    pid_file, done_file = tmp_path / "pid", tmp_path / "done"
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(textwrap.dedent(INNER.format(pid=str(pid_file), done=str(done_file))))
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.interrupt",
            str(test_file),
        ],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, "the inner test started its child")
        child = int(pid_file.read_text())
        assert alive(child)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out
    assert done_file.read_text() == "torn down", out
    assert not alive(child)
