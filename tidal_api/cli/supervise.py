"""Child processes supervised as one unit: `tidal up`'s stack, and the ops worker's two Celery workers.

Children start in order and stop in reverse, SIGTERM first and SIGKILL after a grace period; the supervisor stops
them all on SIGINT, SIGTERM or SIGHUP (``stop_on_signals``), and the kernel sends each SIGTERM if the supervisor
dies, even by SIGKILL (``die_with_parent``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import click

from config.redact import redacted
from tidal_engine.serve import die_with_parent

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LOG_TAIL_BYTES = 64 * 1024  # where a child's last error is looked for: its traceback, if any, ends in there
FIX = re.compile(r"`(tidal [^`]+)`")  # a command an error message names as its fix, e.g. `tidal storage check --reset`


class Stop(Exception):
    """A stop signal arrived; the children are stopped in reverse start order."""


def _stop_on(signum: int, _frame: object) -> None:
    # While the children are being stopped, a second signal must not cut that short.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Stop(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """From now on a stop signal raises :class:`Stop` in the main thread."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_on)


class Supervisor:
    """Children started in order, stopped in reverse; SIGTERM first, SIGKILL after a grace period.

    With a ``log_dir`` (`tidal up`), each child is a service of its own: its log is ``<log_dir>/<name>.log`` and it
    runs in its own session, so a terminal's Ctrl-C reaches only the supervisor, which stops the children in order.
    Without one (the ops worker), the children are parts of this process: they write to its output and stay in its
    process group, so whatever signals or kills the group (a terminal, ``kill -9 -PGID``) reaches them too.
    """

    def __init__(self, env: dict[str, str], log_dir: Path | None):
        self.env = env
        self.log_dir = log_dir
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.log_starts: dict[str, int] = {}  # each child's log is appended to: where this run's part begins

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = None if self.log_dir is None else open(self.log_dir / f"{name}.log", "ab")
        if log is not None:
            self.log_starts[name] = log.seek(0, os.SEEK_END)
        proc = subprocess.Popen(
            argv,
            env=self.env,
            stdout=log,
            stderr=None if log is None else subprocess.STDOUT,
            start_new_session=log is not None,
            preexec_fn=die_with_parent(),
        )
        self.children.append((name, proc))
        where = "" if self.log_dir is None else f" log {self.log_dir / (name + '.log')}"
        click.echo(f"  {name:<7} pid {proc.pid:<7}{where}")
        return proc

    def first_exited(self) -> tuple[str, int] | None:
        for name, proc in self.children:
            if proc.poll() is not None:
                return name, proc.returncode
        return None

    def why_exited(self, name: str, status: int) -> str:
        """What `tidal up` says of a child that exited: its status, its log's last error, the fix that names."""
        assert self.log_dir is not None, "only children with a log have one to read"
        log = self.log_dir / f"{name}.log"
        error = last_error(log, self.log_starts.get(name, 0))
        lines = [f"{name} exited with status {status}" + (f": {error}" if error else "")]
        if error and (fix := FIX.search(error)):
            lines.append(f"  fix: {fix.group(1)}")
        lines.append(f"  its log: {log}")
        return "\n".join(lines)

    def stop(self, grace: float = 15.0) -> None:
        for _name, proc in reversed(self.children):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, proc in reversed(self.children):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                click.echo(f"  {name} did not stop in {grace:.0f} s: killed")
                proc.kill()
                proc.wait()


def last_error(log: Path, since: int = 0) -> str | None:
    """The error a log ends with, after byte ``since``: the exception line of its last traceback (the exception's
    module path left out), else its last line that says error; None if it holds neither. A URL's password in it is
    masked: a child's error can quote TIDAL_REDIS_URL or TIDAL_DATABASE_URL."""
    error = _last_error(log, since)
    return redacted(error) if error else None


def _last_error(log: Path, since: int) -> str | None:
    try:
        with open(log, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if starts:
        raised = next((line for line in lines[starts[-1] + 1 :] if line and not line[0].isspace()), None)
        if raised:
            kind, colon, message = raised.partition(":")
            return kind.rpartition(".")[2] + colon + message
    return next((line.strip() for line in reversed(lines) if "error" in line.lower()), None)
