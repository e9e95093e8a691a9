"""docker-compose.yml is valid, and every command it runs is one the suite runs without Docker."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import yaml

from config import load_settings
from tests.support.deploy_helpers import ALL_PROFILES
from tests.support.deploy_helpers import PASSWORDS
from tests.support.deploy_helpers import ROOT
from tests.support.deploy_helpers import compose_config
from tests.support.deploy_helpers import run_config
from tidal_api.limits import MULTIPART_OVERHEAD

# Commands the compose file may run, each exercised by a test named here.
TESTED_COMMANDS = {
    ("sh", "-c", "tidal db upgrade && tidal serve"): "tests/deploy/test_up.py (tidal up runs db upgrade, then serve)",
    ("tidal", "beat"): "tests/workers/test_recovery.py (two beats: one fires, the standby takes over)",
    ("tidal", "flower"): "tests/deploy/test_flower.py",
    ("tidal", "worker"): "tests/deploy/test_up.py",
    ("tidal", "worker", "--ops"): "tests/reliability/test_ingest_faults.py (kill -9 of the ops worker mid-ingest)",
}


PROFILES = {"gpu": {"vllm", "worker"}, "s3": {"minio", "minio-user"}, "monitoring": {"prometheus", "grafana"}}
CONTROL_PLANE = {"redis", "postgres", "api", "proxy", "ops", "beat", "flower"}


def test_compose_file_is_valid_with_every_service():
    cfg = compose_config(*ALL_PROFILES)
    assert set(cfg["services"]) == CONTROL_PLANE.union(*PROFILES.values())
    for name in set(cfg["services"]) - {"beat", "grafana", "minio-user"}:  # beat only sends; minio-user runs once
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
    argv = vllm["command"]
    assert "--scheduling-policy=priority" in argv
    # The proven class, with the async scheduling vLLM would otherwise run it under (and only warn about) off.
    assert "--scheduler-cls=tidal_engine.scheduler.TidalScheduler" in argv and "--no-async-scheduling" in argv
    assert "--async-scheduling" not in argv
    assert "--max-num-batched-tokens=2048" in argv  # τ as the plugin's settings and benchmarks assume
    assert vllm["environment"]["TIDAL_SCHED_METRICS_PORT"] == "9188" and "9188" in vllm["expose"]
    assert vllm["image"].endswith(":0.32.0")


def test_the_async_plugin_is_chosen_with_async_scheduling():
    out = run_config(
        "--profile",
        "gpu",
        **PASSWORDS,
        TIDAL_SCHEDULER_CLS="tidal_engine.scheduler.TidalAsyncScheduler",
        TIDAL_VLLM_SCHEDULING="async-scheduling",
        TIDAL_MAX_NUM_BATCHED_TOKENS="4096",
    )
    assert out.returncode == 0, out.stderr
    argv = yaml.safe_load(out.stdout)["services"]["vllm"]["command"]
    assert "--scheduler-cls=tidal_engine.scheduler.TidalAsyncScheduler" in argv and "--async-scheduling" in argv
    assert "--no-async-scheduling" not in argv and "--max-num-batched-tokens=4096" in argv


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
    assert "ports" not in api and set(api["expose"]) == {"8080", "9180"}


def _published(svc: dict) -> list[tuple[str, int]]:
    """(host address, host port) of each port a service publishes; compose v1 prints `[ip:]host:container[/tcp]`
    strings or objects, v2 objects."""
    out = []
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            out.append((p.get("host_ip", "0.0.0.0"), int(p["published"])))
        else:
            parts = str(p).split("/")[0].split(":")
            out.append((parts[0] if len(parts) == 3 else "0.0.0.0", int(parts[-2])))
    return out


def test_only_the_front_door_is_published_on_every_address():
    """The API, its metrics and the workers' are on the compose network only; Flower and MinIO (plain HTTP) and
    the monitoring UIs on loopback; the TLS proxy alone on every address."""
    services = compose_config(*ALL_PROFILES)["services"]
    published = {name: _published(svc) for name, svc in services.items() if _published(svc)}
    assert published == {
        "proxy": [("0.0.0.0", 443)],
        "flower": [("127.0.0.1", 5555)],
        "minio": [("127.0.0.1", 9000)],
        "prometheus": [("127.0.0.1", 9090)],
        "grafana": [("127.0.0.1", 3000)],
    }
    private = compose_config(*ALL_PROFILES, MINIO_ADDRESS="10.0.0.5", FLOWER_ADDRESS="10.0.0.5")["services"]
    assert _published(private["minio"]) == [("10.0.0.5", 9000)]
    assert _published(private["flower"]) == [("10.0.0.5", 5555)]
    # The workers' /metrics listen on every address of their container (Prometheus scrapes them by name), which
    # only the compose network reaches; TIDAL_WORKER_METRICS_HOST's default elsewhere is loopback.
    for name in ("ops", "worker"):
        assert services[name]["environment"]["TIDAL_WORKER_METRICS_HOST"] == "0.0.0.0" and "ports" not in services[name]
    assert load_settings({}).worker_metrics_host == "127.0.0.1"


def test_the_front_door_proxies_to_the_api_with_the_shipped_config_and_the_apis_body_limit():
    services = compose_config()["services"]
    proxy, api = services["proxy"], services["api"]
    assert proxy["image"].startswith("nginx:")
    mounts = {v["target"]: v["source"] for v in _volumes(proxy)}
    assert Path(mounts["/etc/nginx/templates/default.conf.template"]) == ROOT / "config/nginx/tidal.conf.template"
    assert (mounts["/etc/nginx/certs/tidal.crt"], mounts["/etc/nginx/certs/tidal.key"]) == (
        PASSWORDS["TLS_CERT_FILE"],
        PASSWORDS["TLS_KEY_FILE"],
    )
    env = proxy["environment"]
    assert (env["PROXY_TLS_CERT"], env["PROXY_TLS_KEY"]) == ("/etc/nginx/certs/tidal.crt", "/etc/nginx/certs/tidal.key")
    assert env["PROXY_UPSTREAM"] == "api:" + api["environment"]["TIDAL_BIND"].rpartition(":")[2]
    # The proxy refuses exactly what the API would: its upload limit plus the multipart framing it allows.
    assert int(env["PROXY_MAX_BODY_BYTES"]) == load_settings({}).max_upload_bytes + MULTIPART_OVERHEAD
    assert proxy["depends_on"]["api"]["condition"] == "service_healthy"
    template = (ROOT / "config/nginx/tidal.conf.template").read_text()
    assert set(re.findall(r"\$\{(\w+)\}", template)) == set(env)  # every variable the template reads, compose sets


def test_vllm_gets_its_own_env_file_without_tidals_secrets(tmp_path):
    """vLLM parses untrusted prompts and media: it never sees the API keys or the storage secret of tidal.env."""
    secrets = {"TIDAL_API_KEYS": "acme:sk-not-for-vllm", "TIDAL_S3_SECRET_ACCESS_KEY": "s3-not-for-vllm"}
    env_file = tmp_path / "tidal.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in secrets.items()))
    out = run_config("--profile", "gpu", **PASSWORDS, TIDAL_ENV_FILE=str(env_file))
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert services["api"]["environment"]["TIDAL_API_KEYS"] == secrets["TIDAL_API_KEYS"]  # the file is read
    vllm = services["vllm"]
    assert str(env_file) not in vllm.get("env_file", []) and not set(secrets) & set(vllm["environment"])
    assert all("sk-not-for-vllm" not in str(v) for v in vllm["environment"].values())
    example = (ROOT / "vllm.env.example").read_text().splitlines()
    named = {line.lstrip("# ").split("=")[0] for line in example if "=" in line and " " not in line.lstrip("# ")}
    assert named and all(n.startswith(("TIDAL_SCHED_", "HF_")) for n in named), named


def _minio_user_script(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """config/minio/tidal-user.sh run with an `mc` that records its calls (each policy file's JSON kept)."""
    calls = tmp_path / "mc-calls.jsonl"
    fake = tmp_path / "bin" / "mc"
    fake.parent.mkdir()
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\nargs = sys.argv[1:]\n"
        "if args[:3] == ['admin', 'policy', 'create']: args[-1] = json.load(open(args[-1]))\n"
        f"open({str(calls)!r}, 'a').write(json.dumps([os.environ.get('MC_HOST_minio'), *args]) + '\\n')\n"
    )
    fake.chmod(0o755)
    full = {"PATH": f"{fake.parent}:{os.environ['PATH']}", "MINIO_URL": "http://minio:9000", **env}
    done = subprocess.run(["sh", str(ROOT / "config/minio/tidal-user.sh")], env=full, capture_output=True, text=True)
    return done, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_tidals_minio_user_is_its_own_and_reaches_only_its_bucket(tmp_path):
    services = compose_config(*ALL_PROFILES)["services"]
    user = services["minio-user"]
    assert user["depends_on"]["minio"]["condition"] == "service_healthy"
    assert user["entrypoint"] == ["sh", "/tidal-user.sh"]
    mounts = {v["target"]: Path(v["source"]) for v in _volumes(user)}
    assert mounts["/tidal-user.sh"] == ROOT / "config/minio/tidal-user.sh"

    root_pw, tidal_secret = "r" * 20 + "Q7-x" * 4, "t" * 20 + "Z9_k" * 4
    env = {
        "MINIO_ROOT_USER": "root",
        "MINIO_ROOT_PASSWORD": root_pw,
        "TIDAL_S3_ACCESS_KEY_ID": "tidal",
        "TIDAL_S3_SECRET_ACCESS_KEY": tidal_secret,
        "TIDAL_S3_BUCKET": "tidal-files",
    }
    done, calls = _minio_user_script(tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert all(c[0] == f"http://root:{root_pw}@minio:9000" for c in calls)  # root's credentials: environment only
    assert not any(root_pw in arg for c in calls for arg in map(str, c[1:]))
    policy = next(c[-1] for c in calls if c[1:4] == ["admin", "policy", "create"])
    resources = {r for statement in policy["Statement"] for r in statement["Resource"]}
    assert resources == {"arn:aws:s3:::tidal-files", "arn:aws:s3:::tidal-files/*"}
    assert all(statement["Effect"] == "Allow" and "*" not in statement["Action"] for statement in policy["Statement"])
    assert [c[1:] for c in calls[1:]] == [
        ["admin", "user", "add", "minio", "tidal", tidal_secret],
        ["admin", "policy", "attach", "minio", "tidal-bucket", "--user", "tidal"],
    ]
    for bad, why in (
        ({"TIDAL_S3_ACCESS_KEY_ID": "root"}, "TIDAL_S3_ACCESS_KEY_ID is MINIO_ROOT_USER"),
        ({"MINIO_ROOT_PASSWORD": "minioadmin"}, "MINIO_ROOT_PASSWORD: at least 32 characters"),
        ({"TIDAL_S3_SECRET_ACCESS_KEY": ""}, "set TIDAL_S3_SECRET_ACCESS_KEY"),
    ):
        (tmp_path / "again").mkdir()
        done, calls = _minio_user_script(tmp_path / "again", **{**env, **bad})
        assert done.returncode != 0 and why in done.stderr and calls == [], (bad, done.stderr)
        subprocess.run(["rm", "-rf", str(tmp_path / "again")], check=True)


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
