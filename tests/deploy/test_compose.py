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
    ("tidal", "worker", "--ops"): "tests/reliability/test_ingest_faults.py (kill -9 of the ops worker mid-ingest)",
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


#: The passwords compose requires (no defaults), as an operator sets them in the shell or `.env`.
PASSWORDS = {"POSTGRES_PASSWORD": "pg-secret", "REDIS_PASSWORD": "redis-secret", "FLOWER_BASIC_AUTH": "admin:secret"}


def compose_config(*args: str) -> dict:
    out = run_config(*args, **PASSWORDS)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


ALL_PROFILES = ("--profile", "gpu", "--profile", "s3", "--profile", "monitoring")
PROFILES = {"gpu": {"vllm", "worker"}, "s3": {"minio"}, "monitoring": {"prometheus", "grafana"}}


def test_compose_file_is_valid_with_every_service():
    cfg = compose_config(*ALL_PROFILES)
    assert set(cfg["services"]) == {"redis", "postgres", "api", "ops", "beat", "flower"}.union(*PROFILES.values())
    for name in set(cfg["services"]) - {"beat", "grafana"}:  # beat only sends: no HTTP port
        assert "healthcheck" in cfg["services"][name], name
    assert cfg["services"]["beat"]["deploy"]["replicas"] == 1


def test_ingest_and_the_sweeps_run_on_the_ops_worker_not_on_a_gpu_node():
    services = compose_config("--profile", "gpu")["services"]
    assert services["ops"]["command"] == ["tidal", "worker", "--ops"] and "profiles" not in services["ops"]
    assert services["worker"]["command"] == ["tidal", "worker"] and services["worker"]["profiles"] == ["gpu"]


def test_optional_services_sit_in_their_profiles():
    services = compose_config(*ALL_PROFILES)["services"]
    for profile, names in PROFILES.items():
        assert {n for n, s in services.items() if profile in s.get("profiles", [])} == names, profile


def test_health_checks_ask_readiness():
    services = compose_config("--profile", "gpu")["services"]
    assert "http://127.0.0.1:8080/ready" in " ".join(services["api"]["healthcheck"]["test"])
    assert "http://127.0.0.1:9187/ready" in " ".join(services["worker"]["healthcheck"]["test"])
    assert "http://127.0.0.1:9189/ready" in " ".join(services["ops"]["healthcheck"]["test"])


def test_every_tidal_process_shares_the_blob_volume():
    """API, workers and beat check at start that they see one storage: on one host, the `blobs` volume."""
    services = compose_config("--profile", "gpu")["services"]
    for name in ("api", "ops", "beat", "worker"):
        svc = services[name]
        assert svc["environment"]["TIDAL_BLOB_DIR"] == "/blobs", name
        assert any(v["source"] == "blobs" and v["target"] == "/blobs" for v in _volumes(svc)), name


def test_image_creates_blobs_writable_for_the_tidal_user():
    tidal_stage = (ROOT / "Dockerfile").read_text().split("FROM ", 2)[1]
    assert "useradd --create-home tidal" in tidal_stage
    assert "mkdir /blobs && chown tidal:tidal /blobs" in tidal_stage
    assert tidal_stage.index("chown tidal:tidal /blobs") < tidal_stage.index("USER tidal")


def test_monitoring_profile_scrapes_every_job_and_loads_the_shipped_files():
    services = compose_config(*ALL_PROFILES)["services"]
    mounts = {v["target"]: v["source"] for v in _volumes(services["prometheus"])}
    assert Path(mounts["/etc/prometheus/prometheus.yml"]) == ROOT / "config/monitoring/prometheus.yml"
    assert Path(mounts["/etc/prometheus/alerts.yml"]) == ROOT / "config/monitoring/alerts.yml"
    scrape = yaml.safe_load((ROOT / "config/monitoring/prometheus.yml").read_text())
    assert scrape["rule_files"] == ["/etc/prometheus/alerts.yml"]
    targets = {job["job_name"]: job["static_configs"][0]["targets"][0] for job in scrape["scrape_configs"]}
    vllm_env = services["vllm"]["environment"]
    assert targets == {
        "tidal-api": "api:9180",
        "tidal-worker": "worker:9187",
        "vllm": "vllm:8000",
        "tidal-scheduler": f"vllm:{vllm_env['TIDAL_SCHED_METRICS_PORT']}",
    }
    assert vllm_env["TIDAL_SCHED_METRICS_HOST"] == "0.0.0.0"
    grafana = {v["target"]: Path(v["source"]) for v in _volumes(services["grafana"]) if v["type"] == "bind"}
    assert grafana["/var/lib/grafana/dashboards"] == ROOT / "config/monitoring/grafana/dashboards"
    assert (grafana["/etc/grafana/provisioning"] / "datasources/prometheus.yml").is_file()


def _volumes(svc: dict) -> list[dict]:
    """A service's volumes in long form (compose v1 prints short `src:dst[:mode]` strings, v2 long objects)."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, str):
            src, dst = v.split(":")[:2]
            v = {"source": src, "target": dst, "type": "bind" if src.startswith("/") else "volume"}
        out.append(v)
    return out


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
    out = run_config(**{**PASSWORDS, "FLOWER_BASIC_AUTH": ""})
    assert out.returncode != 0
    assert "FLOWER_BASIC_AUTH" in out.stderr


def test_every_password_is_required_and_none_has_a_default():
    for name in PASSWORDS:
        out = run_config(**{**PASSWORDS, name: ""})
        assert out.returncode != 0 and f"set {name}" in out.stderr, (name, out.stderr)
    text = (ROOT / "docker-compose.yml").read_text()
    assert "PASSWORD:-" not in text and "AUTH:-" not in text


def test_redis_requires_its_password_and_every_client_sends_it():
    services = compose_config("--profile", "gpu")["services"]
    redis = services["redis"]
    assert "--requirepass" in " ".join(redis["command"]) and redis["environment"]["REDIS_PASSWORD"] == "redis-secret"
    assert "redis-secret" not in " ".join(redis["command"])  # from the environment, not the command line
    clients = {
        name: svc["environment"]["TIDAL_REDIS_URL"]
        for name, svc in services.items()
        if "TIDAL_REDIS_URL" in svc.get("environment", {})
    }
    assert set(clients) == {"api", "ops", "beat", "flower", "worker"}
    assert all(url.startswith("redis://:redis-secret@") for url in clients.values()), clients
    assert all(
        ":pg-secret@" in svc["environment"]["TIDAL_DATABASE_URL"]
        for name, svc in services.items()
        if name in clients and name != "flower"
    )


def test_metrics_listen_apart_from_the_public_port_and_are_not_published():
    api = compose_config()["services"]["api"]
    assert (
        api["environment"]["TIDAL_METRICS_BIND"] == "0.0.0.0:9180"
        and api["environment"]["TIDAL_BIND"] == "0.0.0.0:8080"
    )
    published = [str(p.get("target", p) if isinstance(p, dict) else p) for p in api["ports"]]
    assert all("9180" not in p for p in published) and any("8080" in p for p in published)


def test_minio_and_grafana_refuse_to_start_without_a_password():
    """Both would start with a well-known default password: their entrypoints stop first, naming the variable."""
    services = compose_config(*ALL_PROFILES)["services"]
    for name, variable in (("minio", "MINIO_ROOT_PASSWORD"), ("grafana", "GF_SECURITY_ADMIN_PASSWORD")):
        script = services[name]["entrypoint"][-1].replace("$$", "$")
        guard = script.split(" && ")[0]
        refused = subprocess.run(["sh", "-c", guard], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
        assert refused.returncode != 0 and f"set {variable}" in refused.stderr, (name, refused)
        env = {"PATH": os.environ["PATH"], variable: "secret"}
        assert subprocess.run(["sh", "-c", guard], env=env).returncode == 0, name
