"""Processes the `tidal` command starts beside itself: the cache redis-server `tidal up` runs, and private services a
fault run may break (a redis-server without persistence, a throw-away PostgreSQL cluster).

Each private service runs on a free port of its own, so restarting it disturbs nobody else's Redis or database, and
restarts on the same port, so clients keep their URL as they would across a real restart. Shared by `tidal up`, the
fault and deployment tests (tests/reliability, tests/deploy) and `tidal bench chaos`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import typing as t
from pathlib import Path

import redis

from tidal_engine.serve import die_with_parent
from tidal_engine.serve import free_port


def kill_group(proc: subprocess.Popen) -> None:
    """kill -9 a child started in its own session, with everything it forked."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def until(predicate: t.Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    """Poll ``predicate`` every ``every`` seconds until it holds; TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def cache_redis_command(port: int, data: Path, server: str = "redis-server") -> list[str]:
    """redis-server as Tidal runs it when it starts one: loopback only, nothing kept on disk (Redis holds only
    what SQL can rebuild)."""
    return [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(data)]


class PrivateRedis:
    """A redis-server without persistence: a restart loses every key, as a crashed cache would."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.dir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                cache_redis_command(self.port, self.dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        client = redis.Redis(port=self.port, socket_timeout=2)
        until(lambda: _answers(client), 30, "the private redis-server to answer")

    def restart(self) -> float:
        """kill -9 and start again on the same port; returns the seconds it was down."""
        began = time.monotonic()
        assert self.proc is not None
        kill_group(self.proc)
        self.start()
        return time.monotonic() - began

    def pause(self) -> None:
        """SIGSTOP: the server holds its connections and answers nothing, as behind a stalled network."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or f"/usr/local/bin/{name}"]
    return found[-1]


class PrivatePostgres:
    """A throw-away PostgreSQL cluster (initdb in a temp dir, trust auth) on a free port.

    Run as the ``postgres`` user when the caller runs as root (PostgreSQL refuses root).
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tidal-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def _run(self, *argv: str, timeout: float = 120) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *argv], capture_output=True, timeout=timeout, cwd=self.dir)
        assert done.returncode == 0, f"{argv[0]} failed: {done.stdout.decode()} {done.stderr.decode()}"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(
            pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "pg.log"),
            "-o",
            opts,
            "-w",
            "-t",
            "120",
            "start",
        )

    def restart(self) -> float:
        """Stop at once (``-m immediate``: every connection drops, as in a crash) and start again."""
        began = time.monotonic()
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.start()
        return time.monotonic() - began

    def stop(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
