"""Fixtures for the deployment tests: the worker tests' stub OpenAI-protocol engine."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))  # stub_engine lives with the worker tests

from stub_engine import StubEngine  # noqa: E402


@pytest.fixture
def stub():
    engine = StubEngine()
    yield engine
    engine.close()


@pytest.fixture
def children():
    """Child processes a test starts; any still running at the end get SIGTERM, then SIGKILL."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
