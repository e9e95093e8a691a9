"""Helpers of the deployment tests: free ports and the environment of a `tidal` child process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tidal_env(**settings) -> dict[str, str]:
    """This process's environment without its TIDAL_* variables, plus ``settings`` as TIDAL_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({f"TIDAL_{k.upper()}": str(v) for k, v in settings.items()})
    env["PYTHONPATH"] = str(ROOT)
    return env
