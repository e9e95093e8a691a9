"""Helpers of the deployment tests: the environment of a `tidal` child process, and docker-compose.yml as
`docker compose config` renders it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

#: What compose requires (no defaults), as an operator sets it in the shell or `.env`: passwords and the front
#: door's certificate (the paths are only read by `docker compose up`).
PASSWORDS = {
    "POSTGRES_PASSWORD": "pg-secret",
    "REDIS_PASSWORD": "redis-secret",
    "FLOWER_BASIC_AUTH": "admin:secret",
    "TLS_CERT_FILE": "/etc/tidal/tls/tidal.crt",
    "TLS_KEY_FILE": "/etc/tidal/tls/tidal.key",
}
ALL_PROFILES = ("--profile", "gpu", "--profile", "s3", "--profile", "monitoring")


def compose_argv() -> list[str]:
    """`docker compose` (v2 plugin) where present, else Debian's `docker-compose` v1 (tests/run.sh installs it)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def run_config(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TIDAL_ENV_FILE": "tidal.env.example", "TIDAL_VLLM_ENV_FILE": "vllm.env.example", **env}
    return subprocess.run(
        compose_argv() + list(args) + ["config"], cwd=ROOT, env=full_env, capture_output=True, text=True
    )


def compose_config(*args: str, **env: str) -> dict:
    out = run_config(*args, **PASSWORDS, **env)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def tidal_env(**settings) -> dict[str, str]:
    """This process's environment without its TIDAL_* variables, plus ``settings`` as TIDAL_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDAL_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update({f"TIDAL_{k.upper()}": str(v) for k, v in settings.items()})
    env["PYTHONPATH"] = str(ROOT)
    return env
