"""A pytest run stopped by SIGTERM tears its fixtures down, as one stopped by Ctrl-C does.

tests/run.sh stops the soaks it runs beside the SQLite pass with SIGTERM when the script exits early, and CI
runners stop a job so. Python's default for SIGTERM ends the process at once: no fixture's teardown runs, and a
child a fixture started in a session of its own (a `tidal worker`, an engine) outlives the run. Raised as
KeyboardInterrupt instead, pytest ends the session as interrupted and runs every finalizer first.
"""

from __future__ import annotations

import signal
import types

import pytest


def _interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, _interrupt)
