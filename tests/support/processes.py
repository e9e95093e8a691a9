"""How a test's child process ends: the rule the `children` fixture (tests/conftest.py) applies at teardown."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tidal_api.cli.services import kill_group


def stop(proc: subprocess.Popen) -> None:
    """Stop ``proc`` if it still runs.

    One started in a session of its own (``start_new_session``: the fault tests start `tidal` so, to kill it with
    everything it forked) goes by kill -9 of its process group; any other by SIGTERM, then SIGKILL after 5 s.
    """
    if proc.poll() is None and os.getpgid(proc.pid) == proc.pid:
        kill_group(proc)
        return
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie, ended but not yet reaped by its parent, does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
