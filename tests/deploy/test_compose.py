"""docker-compose.yml is valid, and every command it runs is one the suite runs without Docker."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

# Commands the compose file may run, each exercised by a test named here.
TESTED_COMMANDS = {
    ("sh", "-c", "tidal db upgrade && tidal serve"): "tests/deploy/test_up.py (tidal up runs db upgrade, then serve)",
    ("tidal", "beat"): "tests/workers/test_recovery.py (two beats: one fires, the standby takes over)",
    ("tidal", "flower"): "tests/deploy/test_flower.py",
    ("tidal", "worker"): "tests/deploy/test_up.py",
}


def compose_argv() -> list[str]:
    """`docker compose` (v2 plugin) where present, else Debian's `docker-compose` v1 (tests/run.sh installs it)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def run_config(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, TIDAL_ENV_FILE="tidal.env.example", **env)
    return subprocess.run(
        compose_argv() + list(args) + ["config"], cwd=ROOT, env=full_env, capture_output=True, text=True
    )


def compose_config(*args: str) -> dict:
    out = run_config(*args, FLOWER_BASIC_AUTH="admin:secret")
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_file_is_valid_with_every_service():
    cfg = compose_config("--profile", "gpu")
    assert set(cfg["services"]) == {"redis", "postgres", "api", "beat", "flower", "vllm", "worker"}
    for name in ("redis", "postgres", "api", "flower", "vllm", "worker"):
        assert "healthcheck" in cfg["services"][name], name
    assert cfg["services"]["beat"]["deploy"]["replicas"] == 1


def test_gpu_services_sit_in_the_gpu_profile():
    services = compose_config("--profile", "gpu")["services"]
    assert {n for n, s in services.items() if "gpu" in s.get("profiles", [])} == {"vllm", "worker"}


def test_every_tidal_command_is_one_the_tests_run():
    services = compose_config("--profile", "gpu")["services"]
    for name, svc in services.items():
        if svc.get("image", "").startswith("tidal:"):
            assert tuple(svc["command"]) in TESTED_COMMANDS, (name, svc["command"])


def test_every_named_test_exists():
    for where in TESTED_COMMANDS.values():
        assert (ROOT / where.split()[0]).is_file(), where


def test_vllm_runs_priority_policy_and_the_plugin():
    vllm = compose_config("--profile", "gpu")["services"]["vllm"]
    argv = " ".join(vllm["command"])
    assert "--scheduling-policy=priority" in argv
    assert "--scheduler-cls=tidal_engine.scheduler.TidalScheduler" in argv
    assert vllm["image"].endswith(":0.32.0")


def test_flower_requires_basic_auth():
    out = run_config(FLOWER_BASIC_AUTH="")
    assert out.returncode != 0
    assert "FLOWER_BASIC_AUTH" in out.stderr
