"""`tidal serve` starts gunicorn (gthread) with config/gunicorn.py and answers over real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from config.settings import SettingsError
from config.settings import env_name
from tidal_api import create_app
from tidal_engine.serve import free_port


def test_tidal_serve_runs_the_api_under_gunicorn(settings, rt, tmp_path):  # rt: an empty store
    port = free_port()
    overrides = {
        "home": settings.home,
        "database_url": settings.database_url,
        "redis_url": settings.redis_url,
        "api_keys": settings.api_keys,
        "env": "prod",
        "bind": f"127.0.0.1:{port}",
        "api_workers": 2,
        "api_threads": 2,
    }
    env = {**os.environ, **{env_name(k): str(v) for k, v in overrides.items()}}
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidal_api.cli", "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/openapi.json", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        with openai.OpenAI(base_url=url + "/v1", api_key="acme-key", max_retries=0) as client:
            f = client.files.create(file=("a.jsonl", b"{}\n"), purpose="user_data")
            assert [x.id for x in client.files.list().data] == [f.id]  # the store was migrated and keys synced
        r = httpx.get(url + "/v1/files", headers={"Authorization": "Bearer tidal-dev-key"})
        assert r.status_code == 401  # not dev mode: no dev key
        assert b"gthread" in (tmp_path / "serve.log").read_bytes()
        # /metrics merges the samples of both workers (multiprocess mode, set up by `tidal serve`)
        for _ in range(20):
            httpx.get(url + "/v1/files", headers={"Authorization": "Bearer acme-key"})
        scrape = httpx.get(url + "/metrics").text
        assert 'tidal_api_request_seconds_count{method="GET",route="/v1/files",status="200"} 21.0' in scrape
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        log.close()


BAD_PRICES = '{"tiny": [1, 2]'  # one brace short


def test_a_bad_setting_stops_tidal_serve_before_gunicorn_starts(tmp_path):
    env = {**os.environ, "TIDAL_PRICES": BAD_PRICES, "TIDAL_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "tidal_api.cli", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: invalid Tidal settings") and "TIDAL_PRICES is not JSON" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "home").exists()  # stopped before it prepared anything


def test_the_app_factory_refuses_a_bad_setting_before_touching_the_store(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDAL_PRICES", BAD_PRICES)
    monkeypatch.setenv("TIDAL_HOME", str(tmp_path / "home"))
    with pytest.raises(SettingsError, match="TIDAL_PRICES is not JSON"):
        create_app()
    assert not (tmp_path / "home").exists()  # no database created, no migration run
