"""`tidal up`: the docker-compose topology on one machine, without Docker.

API (gunicorn), one worker, one ops worker, one beat and optionally Flower, each the same
`tidal ...` command docker-compose.yml runs, supervised here: if one exits the
rest are stopped. SIGINT (Ctrl-C), SIGTERM and SIGHUP stop them all, so any
supervisor (systemd, a container runtime, ``timeout``, a closed terminal) can
stop the stack; if ``tidal up`` itself is killed with SIGKILL, the kernel sends
each child SIGTERM (``PR_SET_PDEATHSIG``), and each shuts its own children down.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import click
import redis
import requests

from config import Settings
from config import load_settings
from config.redact import redacted
from config.settings import child_environ
from tidal_api.cli.services import cache_redis_command
from tidal_api.cli.supervise import Stop
from tidal_api.cli.supervise import Supervisor
from tidal_api.cli.supervise import stop_on_signals
from tidal_engine.serve import die_with_parent


def ensure_redis(settings: Settings, sup: Supervisor) -> None:
    """Use TIDAL_REDIS_URL if it answers; else start a redis-server under TIDAL_HOME on its port."""
    client = redis.Redis.from_url(settings.redis_url)
    try:
        client.ping()
        return
    except redis.ConnectionError:
        pass
    server = shutil.which("redis-server")
    url = urlparse(settings.redis_url)
    if server is None or url.hostname not in ("127.0.0.1", "localhost"):
        raise click.ClickException(
            f"no Redis answers at {redacted(settings.redis_url)} and none can be started here "
            "(install redis-server, or set TIDAL_REDIS_URL to a running Redis)"
        )
    data = Path(settings.home) / "redis"
    data.mkdir(parents=True, exist_ok=True)
    sup.start("redis", cache_redis_command(url.port or 6379, data, server))
    for _ in range(50):
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.1)
    raise click.ClickException("redis-server did not come up; see its log")


def wait_for_api(base_url: str, sup: Supervisor, timeout: float = 60.0) -> None:
    """Return once the API answers (gunicorn takes seconds to boot); fail if a child exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (exited := sup.first_exited()) is not None:
            raise click.ClickException(sup.why_exited(*exited))
        try:
            if requests.get(base_url + "/openapi.json", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.25)
    raise click.ClickException(f"the API did not answer at {base_url} within {timeout:.0f} s; see api.log")


def why_dev_mode(settings: Settings, asked: bool) -> str | None:
    """Why `tidal up` runs in dev mode (the public key `tidal-dev-key`), or None: only when asked (``--dev``), or
    when no key could reach the API otherwise (none configured, none live in the migrated store)."""
    if asked:
        return "--dev"
    if settings.api_keys:
        return None
    from tidal_workers.store import Store
    from tidal_workers.store.api_keys import has_live_key

    store = Store(settings)
    try:
        return None if has_live_key(store) else "no TIDAL_API_KEYS configured and no key stored"
    finally:
        store.dispose()


@click.command()
@click.option("--flower/--no-flower", default=False, help="Also run the Flower UI.")
@click.option("--demo", is_flag=True, help="Start the tiny local engine and follow a sample batch to completion.")
@click.option("--dev", is_flag=True, help="Dev mode (TIDAL_ENV=dev) whatever keys exist: the key tidal-dev-key works.")
def up(flower: bool, demo: bool, dev: bool) -> None:
    """Run the whole Tidal stack on this machine until Ctrl-C (or SIGTERM / SIGHUP)."""
    stop_on_signals()
    settings = load_settings()
    tidal = [sys.executable, "-m", "tidal_api.cli"]
    log_dir = Path(settings.home) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(child_environ(), log_dir)
    engine = None
    click.echo(f"tidal up: home {settings.home}")
    try:
        if demo:
            from tidal_engine.serve import start_tiny

            click.echo("starting the tiny local vLLM engine (about 30 s) ...")
            engine = start_tiny(settings, log_path=log_dir / "vllm.log")
            sup.env["TIDAL_VLLM_URL"] = engine.url
        ensure_redis(settings, sup)
        # subprocess.run kills the migration if a stop signal interrupts the wait.
        subprocess.run(tidal + ["db", "upgrade"], env=sup.env, check=True, preexec_fn=die_with_parent())
        if settings.env != "dev" and (why := why_dev_mode(settings, dev)):
            click.echo(f"{why}: running in dev mode with the public key tidal-dev-key")
            sup.env["TIDAL_ENV"] = "dev"
        sup.start("api", tidal + ["serve"])
        sup.start("worker", tidal + ["worker"])
        sup.start("ops", tidal + ["worker", "--ops"])  # finalize, the sweeps and ingest, beside the GPU node's worker
        sup.start("beat", tidal + ["beat"])
        if flower:
            sup.start("flower", tidal + ["flower", "--address", "127.0.0.1"])
        base_url = f"http://{settings.bind}"
        wait_for_api(base_url, sup)
        click.echo(f"API on {base_url}/v1  (Ctrl-C or SIGTERM stops everything)")
        if demo:
            from tidal_api.cli.demo import run_demo

            dev = sup.env.get("TIDAL_ENV", settings.env) == "dev"
            run_demo(base_url, "tidal-dev-key" if dev else settings.configured_keys[0][1])
        while (exited := sup.first_exited()) is None:
            time.sleep(0.5)
        click.echo(f"{sup.why_exited(*exited)}\nstopping the rest")
        raise SystemExit(1)
    except Stop as stop:
        click.echo(f"\n{stop}: stopping ...")
    finally:
        sup.stop()
        if engine is not None:
            engine.stop()


COMMANDS = [up]
