"""`tidal up` end to end: its own Redis, `db upgrade`, gunicorn, a worker, the ops worker, beat; a batch completes;
Ctrl-C stops all.

This is also the no-Docker run of docker-compose's `tidal db upgrade && tidal serve`
and `tidal worker` (tests/deploy/test_compose.py, TESTED_COMMANDS).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import typing as t
from pathlib import Path

import psutil
import pytest
import redis
import requests

from tests.support.deploy_helpers import ROOT
from tests.support.deploy_helpers import tidal_env
from tests.support.processes import alive
from tests.support.wait import wait_for
from tidal_api.cli.services import PrivateRedis
from tidal_api.cli.supervise import last_error
from tidal_api.cli.up import why_dev_mode
from tidal_engine.serve import free_port
from tidal_workers import keys
from tidal_workers.blobs.sentinel import SENTINEL_PREFIX
from tidal_workers.blobs.sentinel import Sentinel
from tidal_workers.store import api_keys

GRACE_S = 20.0  # Supervisor.stop's 15 s, plus the time to exit

UP_KEY = "sk-up-7ZAhURrUsKUhzMFX-MHq-tTsff7fLuONJUa2"  # production mode refuses weak keys


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children in their own sessions included), from /proc."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent_of.items() if pp in frontier} - found
        found |= frontier
    return found


def up_env(tmp_path: Path, engine_url: str, redis_url: str, bind: str) -> dict[str, str]:
    """A production-mode `tidal up` under a temp home (SQLite) on ``redis_url``, in front of ``engine_url``."""
    return tidal_env(
        home=tmp_path / "home",
        database_url="",
        redis_url=redis_url,
        vllm_url=engine_url,
        bind=bind,
        api_keys=f"acme:{UP_KEY}",
        env="prod",
        api_workers=2,
        api_threads=2,
        node="up-test",
        gate_mode="fixed",
        claim_idle_seconds=0.05,
        worker_threads=4,
        worker_metrics_port=0,
        sync_validate_bytes=0,  # every batch is ingested by the ops worker
    )


@pytest.fixture
def up(tmp_path, stub):
    """`tidal up` with its own Redis on a free port, SQLite under a temp home, the stub as its engine."""
    with running_up(tmp_path, stub) as proc:
        yield proc


@contextlib.contextmanager
def running_up(tmp_path: Path, stub, *args: str, **settings: str) -> t.Iterator[subprocess.Popen]:
    """`tidal up *args` on ``up_env`` with ``settings`` over it; everything it started is stopped at the end."""
    bind = f"127.0.0.1:{free_port()}"
    env = up_env(tmp_path, stub.url, f"redis://127.0.0.1:{free_port()}/0", bind)
    env.update({f"TIDAL_{name.upper()}": value for name, value in settings.items()})
    out = open(tmp_path / "up.out", "w+b")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidal_api.cli", "up", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
    )
    proc.base_url, proc.out_path = f"http://{bind}", tmp_path / "up.out"
    try:
        yield proc
    finally:
        _stop(proc)
        out.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:  # the test failed before its Ctrl-C: clean up everything it started
        family = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        for pid in family:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _api_ready(base_url: str) -> bool:
    try:
        return requests.get(base_url + "/openapi.json", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def test_up_runs_a_batch_and_ctrl_c_stops_every_process(up):
    wait_for(lambda: _api_ready(up.base_url) or up.poll() is not None, 60, "the API")
    assert up.poll() is None, up.out_path.read_text()
    log = up.out_path.read_text()
    started = {name: int(pid) for name, pid in re.findall(r"^\s+(\w+)\s+pid (\d+)", log, re.M)}
    assert set(started) == {"redis", "api", "worker", "ops", "beat"}, log

    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {UP_KEY}"
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": f"c{i}"}]},
        }
        for i in range(5)
    ]
    upload = http.post(
        up.base_url + "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines))},
        timeout=30,
    )
    assert upload.status_code == 200, upload.text
    batch = http.post(
        up.base_url + "/v1/batches",
        timeout=30,
        json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    ).json()

    done = wait_for(
        lambda: (
            (b := http.get(f"{up.base_url}/v1/batches/{batch['id']}", timeout=10).json())["status"]
            in ("completed", "failed")
            and b
        ),
        60,
        "the batch to finish",
    )
    assert done["status"] == "completed" and done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    out = http.get(f"{up.base_url}/v1/files/{done['output_file_id']}/content", timeout=10).text.splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in out) == [f"c{i}" for i in range(5)]
    assert json.loads(out[0])["response"]["status_code"] == 200

    family = descendants(up.pid)  # the children plus gunicorn's workers
    assert set(started.values()) <= family
    up.send_signal(signal.SIGINT)
    assert up.wait(GRACE_S) == 0
    still = [pid for pid in family if alive(pid)]
    assert still == [], f"left running: {still}\n{up.out_path.read_text()}"
    log = up.out_path.read_text()
    assert "stopping" in log and "did not stop" not in log and "Traceback" not in log, log


def _started(up) -> dict[str, int]:
    """The children `tidal up` reports, once its API answers."""
    wait_for(lambda: _api_ready(up.base_url) or up.poll() is not None, 60, "the API")
    assert up.poll() is None, up.out_path.read_text()
    log = up.out_path.read_text()
    return {name: int(pid) for name, pid in re.findall(r"^\s+(\w+)\s+pid (\d+)", log, re.M)}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_supervisors_stop_signal_stops_every_process(up, sig):
    """systemd, a container runtime or `timeout` send SIGTERM; a closed terminal sends SIGHUP."""
    started = _started(up)
    family = descendants(up.pid)
    assert set(started.values()) <= family
    up.send_signal(sig)
    assert up.wait(GRACE_S) == 0, up.out_path.read_text()
    still = [pid for pid in family if alive(pid)]
    assert still == [], f"left running after {sig.name}: {still}\n{up.out_path.read_text()}"
    assert f"{sig.name}: stopping" in up.out_path.read_text()


def test_children_die_with_a_killed_supervisor(up):
    """kill -9 of `tidal up` runs none of its code: the kernel's parent-death signal stops each child."""
    started = _started(up)
    family = descendants(up.pid)
    up.kill()
    up.wait(GRACE_S)
    try:
        wait_for(lambda: not any(alive(pid) for pid in family), GRACE_S, "every child of the killed `tidal up` to exit")
    except AssertionError as exc:  # name the survivors, so a repeat can be diagnosed
        raise AssertionError(f"{exc}; left running: {[_command(pid) for pid in family if alive(pid)]}") from None
    assert set(started) == {"redis", "api", "worker", "ops", "beat"}


def _command(pid: int) -> str:
    try:
        return f"{pid} " + " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"{pid} (gone)"


def test_up_without_redis_or_redis_server_says_how_to_fix_it(tmp_path):
    port = free_port()
    env = tidal_env(home=tmp_path / "home", redis_url=f"redis://:up-s3cret@127.0.0.1:{port}/0", api_keys=f"a:{UP_KEY}")
    env["PATH"] = str(tmp_path)  # no redis-server to start
    done = subprocess.run(
        [sys.executable, "-m", "tidal_api.cli", "up"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "no Redis answers" in done.stderr and "install redis-server" in done.stderr, done.stderr
    assert f"at redis://:***@127.0.0.1:{port}/0 " in done.stderr and "up-s3cret" not in done.stdout + done.stderr


def test_a_child_that_exits_during_start_is_named_with_its_last_error_and_the_fix_it_names(tmp_path, stub):
    """A new user's first `tidal up` on a Redis another Tidal home has used: every process refuses that home's
    storage sentinel, and `tidal up` says why and how to fix it, not only which child exited."""
    other_home = PrivateRedis(tmp_path)
    try:
        theirs = Sentinel(SENTINEL_PREFIX + "0" * 16, "0" * 32, "api on their-host (pid 1)", "/their/home/blobs", 0.0)
        redis.Redis.from_url(other_home.url).set(keys.STORAGE_SENTINEL, theirs.to_json())
        done = subprocess.run(
            [sys.executable, "-m", "tidal_api.cli", "up"],
            cwd=ROOT,
            env=up_env(tmp_path, stub.url, other_home.url, f"127.0.0.1:{free_port()}"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        other_home.stop()
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    why = re.search(r"^Error: (\w+) exited with status 1: StorageNotShared: (.*)$", said, re.M)
    assert why is not None, said
    assert f"cannot see the storage sentinel {theirs.name} that {theirs.by}" in why.group(2), said
    assert "\n  fix: tidal storage check --reset\n" in said, said
    assert f"its log: {tmp_path / 'home' / 'logs' / why.group(1)}.log" in said, said


def test_the_last_error_is_read_from_this_runs_part_of_the_log(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text(
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nOSError: an earlier run\'s error\n'
    )
    since = log.stat().st_size
    assert last_error(log) == "OSError: an earlier run's error"
    assert last_error(log, since) is None  # appended to by each run: an earlier run's error is not this one's
    with log.open("a") as f:
        f.write("[12:00:00: ERROR/MainProcess] consumer: Cannot connect to redis\nTraceback (most recent call last):\n")
        f.write('  File "y.py", line 2\ntidal_workers.blobs.sentinel.StorageNotShared: run `tidal storage check`\n')
        f.write("worker: Warm shutdown (MainProcess)\n")
    assert last_error(log, since) == "StorageNotShared: run `tidal storage check`"  # the module path left out
    log.write_text("starting\n[12:00:00: ERROR/MainProcess] consumer: Cannot connect to redis\nbye\n")
    assert last_error(log) == "[12:00:00: ERROR/MainProcess] consumer: Cannot connect to redis"
    log.write_text("OSError: no store at postgresql://tidal:pg-s3cret@db:5432/tidal?password=pg-s3cret\n")
    assert last_error(log) == "OSError: no store at postgresql://tidal:***@db:5432/tidal?password=***"  # masked
    assert last_error(tmp_path / "absent.log") is None


def test_up_without_configured_keys_stays_in_production_while_a_stored_key_is_live(tmp_path, stub):
    """`tidal keys create` keys and no TIDAL_API_KEYS, as tidal.env.example suggests: the public dev key must not
    open the API (`tidal up` once entered dev mode whenever TIDAL_API_KEYS was empty)."""
    env = up_env(tmp_path, stub.url, "redis://127.0.0.1:1/0", "127.0.0.1:1")
    env["TIDAL_API_KEYS"] = ""
    argv = [sys.executable, "-m", "tidal_api.cli", "keys", "create", "--tenant", "acme", "--name", "prod"]
    created = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert created.returncode == 0, created.stderr
    stored_key = created.stdout.strip()
    with running_up(tmp_path, stub, api_keys="") as up:
        _started(up)
        assert "dev mode" not in up.out_path.read_text()

        def files(key: str) -> int:
            return requests.get(
                up.base_url + "/v1/files", headers={"Authorization": f"Bearer {key}"}, timeout=10
            ).status_code

        assert (files("tidal-dev-key"), files(stored_key)) == (401, 200)


def test_dev_mode_only_when_asked_or_when_no_key_is_live(rt, settings):
    prod = settings.replace(env="prod", api_keys="")
    assert why_dev_mode(prod, asked=False) is None  # the keys the test settings configured are stored, and live
    for stored in api_keys.listed(rt.store):
        api_keys.revoke(rt.store, stored.id)
    assert why_dev_mode(prod, asked=False) == "no TIDAL_API_KEYS configured and no key stored"
    row, _key = api_keys.create(rt.store, "acme", "prod")
    assert why_dev_mode(prod, asked=False) is None
    assert why_dev_mode(prod, asked=True) == "--dev"
    api_keys.revoke(rt.store, row.id)
    assert why_dev_mode(prod, asked=False) == "no TIDAL_API_KEYS configured and no key stored"
    assert why_dev_mode(prod.replace(api_keys=f"acme:{UP_KEY}"), asked=False) is None
