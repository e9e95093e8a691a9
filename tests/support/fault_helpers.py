"""Services a fault test may break: a private Redis, a private PostgreSQL cluster, `tidal serve`, a real vLLM.

The shared Redis (6379) and PostgreSQL (5432) carry other sessions' tests, so
every restart here happens to a private instance on a free port, torn down
with the test module (``tidal_api.cli.services``, which `tidal bench chaos`
uses too). Each service restarts on the same port, so clients keep their URL, as
a real restart would.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import requests

from tests.support.wait import wait_for
from tests.support.worker_helpers import CHAT
from tests.support.worker_helpers import ROOT
from tests.support.worker_helpers import settings_env
from tidal_api.cli.services import kill_group
from tidal_engine.serve import EngineOptions
from tidal_engine.serve import free_port
from tidal_engine.serve import start_engine


def spawn_tidal(settings, *args: str, log: Path, tree: Path = ROOT) -> subprocess.Popen:
    """``tidal <args>`` with exactly ``settings``, in a new session so kill_group takes all its processes.

    ``tree``: the source tree it runs from (another release's, for the upgrade test); this checkout by default.
    """
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tidal_api.cli", *args],
            cwd=tree,
            env={**settings_env(settings), "PYTHONPATH": str(tree)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start_worker(
    settings, node: str, log_dir: Path, timeout: float = 180, ops: bool = False, tree: Path = ROOT
) -> subprocess.Popen:
    """`tidal worker` on ``node`` (with ``ops``: `tidal worker --ops`), returned once Celery logs it ready (a GPU
    node's claim thread is then running). Its log, appended to by each start, is ``log_dir/worker-<node>.log``
    (``ops-<node>.log``)."""
    log = log_dir / f"{'ops' if ops else 'worker'}-{node}.log"
    already = log.read_bytes().count(b" ready.") if log.exists() else 0
    args = ["worker", "--ops"] if ops else ["worker"]
    proc = spawn_tidal(settings.replace(node=node), *args, "--loglevel=info", log=log, tree=tree)
    wait_for(
        lambda: proc.poll() is not None or log.read_bytes().count(b" ready.") > already, timeout, what=f"worker {node}"
    )
    assert proc.poll() is None, f"worker {node} died: {log.read_text()[-3000:]}"
    return proc


def start_api(settings, log: Path, timeout: float = 180) -> subprocess.Popen:
    """`tidal serve` (gunicorn) on ``settings.bind``, returned once it answers GET /v1/files."""
    proc = spawn_tidal(settings, "serve", log=log)
    url = f"http://{settings.bind}/v1/files"

    def up() -> bool:
        assert proc.poll() is None, f"tidal serve died: {log.read_text()[-3000:]}"
        try:
            return requests.get(url, headers={"Authorization": "Bearer acme-key"}, timeout=5).status_code == 200
        except requests.RequestException:
            return False

    wait_for(up, timeout, what="tidal serve to answer")
    return proc


class TinyVllm:
    """The tiny model under a real vLLM-CPU server on a fixed port, so a restarted one keeps the URL."""

    def __init__(self, home: str, log_dir: Path):
        from tidal_engine.tiny import build_tiny

        self.options = EngineOptions(
            model=str(build_tiny(home)),
            served_model_name="tiny",
            port=free_port(),
            kv_cache_bytes="8M",
            max_model_len=1024,
            max_num_seqs=4,
        )
        self.log_dir = log_dir
        self.starts: list[float] = []  # seconds each start took to a healthy /health
        self.engine = self._start()
        self.url = self.engine.url

    def _start(self):
        engine = start_engine(self.options, log_path=self.log_dir / f"vllm-{len(self.starts)}.log", timeout_s=300)
        self.starts.append(engine.started_s)
        return engine

    def kill9(self) -> None:
        kill_group(self.engine.process)

    def restart(self) -> None:
        self.engine = self._start()

    def stop(self) -> None:
        self.engine.stop()


def _json_line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


class SlowUpload:
    """A multipart upload sent over a raw socket with a true Content-Length, body trickled in chunks.

    The server sees a well-formed request that is simply not finished yet when it dies.
    """

    BOUNDARY = "tidalfaultboundary"

    def __init__(self, host: str, port: int, total_body: int, key: str = "acme-key", purpose: str = "batch"):
        head = (
            f'--{self.BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
            f'--{self.BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        self.tail = f"\r\n--{self.BOUNDARY}--\r\n".encode()
        self.head_bytes = len(head)
        self.length = len(head) + total_body + len(self.tail)
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.sendall(
            (
                f"POST /v1/files HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: multipart/form-data; boundary={self.BOUNDARY}\r\n"
                f"Content-Length: {self.length}\r\nConnection: close\r\n\r\n"
            ).encode()
            + head
        )
        self.sent = 0

    def send(self, nbytes: int) -> None:
        line = _json_line({"custom_id": "x", "method": "POST", "url": CHAT, "body": {"model": "m"}})
        chunk = (line * (nbytes // len(line) + 1))[:nbytes]
        self.sock.sendall(chunk)
        self.sent += nbytes

    def finish(self) -> bytes:
        """Send the rest of the file and the closing boundary; the server's whole answer."""
        self.send(self.length - len(self.tail) - self.head_bytes - self.sent)
        self.sock.sendall(self.tail)
        answer = b""
        while chunk := self.sock.recv(65536):
            answer += chunk
        return answer

    def close(self) -> None:
        self.sock.close()
