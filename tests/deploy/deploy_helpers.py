"""Helpers of the deployment tests: the environment of a `tidal` child process."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tidal_env(**settings) -> dict[str, str]:
    """This process's environment without its TIDAL_* variables, plus ``settings`` as TIDAL_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({f"TIDAL_{k.upper()}": str(v) for k, v in settings.items()})
    env["PYTHONPATH"] = str(ROOT)
    return env
