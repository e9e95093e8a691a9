"""`tidal serve` starts gunicorn (gthread) with config/gunicorn.py and answers over real HTTP."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import typing as t
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from config.settings import SettingsError
from config.settings import env_name
from tests.support.wait import wait_for
from tidal_api import create_app
from tidal_engine.serve import free_port
from tidal_workers.runtime import Runtime

ACCESS_LOG = "tidal-access %(p)s %(r)s %(s)s"  # the answering worker's pid, the request line, the status
STRONG_KEY = "sk-serve-vAWjz4kohyNNBo0llNQ_UG77RwCLRJr5V-2e"  # production refuses weak keys


@dataclasses.dataclass
class Served:
    """A running `tidal serve`: its public and metrics URLs, the environment it runs in, its log."""

    url: str
    metrics_url: str
    env: dict[str, str]
    proc: subprocess.Popen
    log_path: Path

    def workers(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children()

    def answered_by(self, tag: str) -> dict[str, str]:
        """pid -> status of the request whose request line carries ``tag``, from the access log.

        Gunicorn writes the access line after the response has gone out, so the client can hold its answer
        before the line is in the log: wait for it (generously) rather than read once.
        """
        pattern = rf"tidal-access <(\d+)> \S+ \S*[?&]tag={tag}\S* \S+ (\d+)"
        return dict(wait_for(lambda: re.findall(pattern, self.log_path.read_text()), 30, f"an access line for {tag}"))

    def tidal(self, *args: str) -> str:
        """A `tidal` command against the same store; its stdout."""
        done = subprocess.run(
            [sys.executable, "-m", "tidal_api.cli", *args], env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture
def serve_overrides() -> dict[str, object]:
    """Settings a test changes for its `tidal serve` (parametrize this name to set them; `"bind": "unix"` binds the
    public API to a unix socket under the test's directory)."""
    return {}


@pytest.fixture
def served(settings, rt, tmp_path, serve_overrides, children):  # rt: an empty store
    port, metrics_port = free_port(), free_port()
    overrides = {
        "home": settings.home,
        "database_url": settings.database_url,
        "redis_url": settings.redis_url,
        "api_keys": f"acme:{STRONG_KEY}",
        "env": "prod",
        "bind": f"127.0.0.1:{port}",
        "metrics_bind": f"127.0.0.1:{metrics_port}",
        "api_workers": 2,
        "api_threads": 2,
        **serve_overrides,
    }
    if overrides["bind"] == "unix":
        overrides["bind"] = f"unix:{tmp_path / 'api.sock'}"
    env = {**os.environ, **{env_name(k): str(v) for k, v in overrides.items()}}
    log_path = tmp_path / "serve.log"
    argv = ["serve", "--access-logformat", ACCESS_LOG, "--keep-alive", "600"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidal_api.cli", *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    children.append(proc)
    server = Served(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}", env, proc, log_path)

    def up() -> bool:
        assert proc.poll() is None, log_path.read_text()
        return len(server.workers()) >= 2 and _answers(server.metrics_url + "/health")

    wait_for(up, 120, lambda: f"two workers and the metrics port: {log_path.read_text()}", every=0.2)
    return server


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_tidal_serve_runs_the_api_under_gunicorn(served):
    with openai.OpenAI(base_url=served.url + "/v1", api_key=STRONG_KEY, max_retries=0) as client:
        f = client.files.create(file=("a.jsonl", b"{}\n"), purpose="user_data")
        assert [x.id for x in client.files.list().data] == [f.id]  # the store was migrated and keys synced
    r = httpx.get(served.url + "/v1/files", headers={"Authorization": "Bearer tidal-dev-key"})
    assert r.status_code == 401  # not dev mode: no dev key
    assert b"gthread" in served.log_path.read_bytes()
    # /metrics merges the samples of both workers (multiprocess mode, set up by `tidal serve`) ...
    for _ in range(20):
        httpx.get(served.url + "/v1/files", headers={"Authorization": f"Bearer {STRONG_KEY}"})
    scrape = httpx.get(served.metrics_url + "/metrics").text
    assert 'tidal_api_request_seconds_count{method="GET",route="/v1/files",status="200"} 21.0' in scrape
    # ... on the metrics port only: the public port answers 404 as for any unknown URL, and the metrics port
    # serves nothing of the API
    public = httpx.get(served.url + "/metrics")
    assert public.status_code == 404 and public.json()["error"]["code"] == "unknown_url"
    assert "tidal_" not in public.text
    assert (
        httpx.get(served.metrics_url + "/v1/files", headers={"Authorization": f"Bearer {STRONG_KEY}"}).status_code
        == 404
    )
    assert httpx.get(served.metrics_url + "/ready").json()["status"] == "ready"


def _at_once(clients: list[httpx.Client], tags: list[str]) -> list[int]:
    """Each client's first request, all released together (so the workers' accept loops share them)."""
    go = threading.Barrier(len(clients))
    statuses = [0] * len(clients)

    def first(n: int) -> None:
        go.wait()
        statuses[n] = clients[n].get("/v1/files", params={"tag": tags[n]}).status_code

    threads = [threading.Thread(target=first, args=(n,)) for n in range(len(clients))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return statuses


def _every_worker_answers(served: Served, key: str, tag: str, status: int) -> set[str]:
    """Send ``key``'s requests, 8 at a time, until every gunicorn worker has answered one; each must be ``status``."""
    pids = {str(w.pid) for w in served.workers()}
    answered: set[str] = set()
    rounds = itertools.count()

    def every_one_answered() -> bool:
        n = next(rounds)
        clients = [httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {key}"}) for _ in range(8)]
        tags = [f"{tag}-{n}-{i}" for i in range(len(clients))]
        statuses = _at_once(clients, tags)
        for client in clients:
            client.close()
        assert statuses == [status] * len(clients), statuses
        for one in tags:
            by = served.answered_by(one)
            assert set(by.values()) == {str(status)}, by
            answered.update(set(by) & pids)
        return answered == pids

    wait_for(
        every_one_answered, 120, lambda: f"every worker to answer {tag}: only {sorted(answered)} of {sorted(pids)}"
    )
    return answered


@pytest.mark.parametrize("serve_overrides", [{"bind": "unix"}])
def test_on_a_unix_socket_no_host_header_reaches_the_metrics_port(served):
    """On a unix socket gunicorn takes SERVER_PORT from the Host header: the metrics port is the listener's."""
    socket_path = served.env["TIDAL_BIND"].removeprefix("unix:")
    metrics_port = served.metrics_url.rpartition(":")[2]
    auth = {"Authorization": f"Bearer {STRONG_KEY}"}
    transport = httpx.HTTPTransport(uds=socket_path)
    with httpx.Client(transport=transport, base_url=f"http://x:{metrics_port}", timeout=30) as public:
        r = public.get("/metrics")  # Host: x:<metrics port>, on the public socket
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url", r.text
        assert public.get("/v1/files", headers=auth).status_code == 200  # the API, as on any Host
    assert "tidal_batches" in httpx.get(served.metrics_url + "/metrics").text
    assert httpx.get(served.metrics_url + "/v1/files", headers=auth).status_code == 404


def test_a_revoked_key_is_refused_by_both_workers_at_their_next_request(served):
    key = served.tidal("keys", "create", "--tenant", "initech", "--name", "to revoke").strip()
    (key_id,) = [
        json.loads(line)["id"]
        for line in served.tidal("keys", "list", "--json").splitlines()
        if json.loads(line)["tenant"] == "initech"
    ]
    assert len(_every_worker_answers(served, key, "before", 200)) == 2  # each worker has served (and cached) the key
    served.tidal("keys", "revoke", key_id)  # another process; neither worker is told or restarted
    # Every request after the revoke is refused, whichever worker takes it. (A kept-alive connection can be
    # closed by gunicorn's keep-alive timeout while the revoke runs, so no request is pinned to a worker.)
    _every_worker_answers(served, key, "after", 401)
    with openai.OpenAI(base_url=served.url + "/v1", api_key=STRONG_KEY, max_retries=0) as client:
        client.files.list()  # other keys are untouched


def _peak_rss(pid: int) -> int:
    """VmHWM: the most memory the process has held since its peak was last reset, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def test_a_10_mb_json_body_is_refused_before_it_is_read(served):
    workers = served.workers()
    for w in workers:
        Path(f"/proc/{w.pid}/clear_refs").write_text("5")  # reset each worker's peak RSS to its RSS now
    before = {w.pid: w.memory_info().rss for w in workers}
    body = b'{"input_file_id": "' + b"f" * (10 * 1024 * 1024) + b'", "endpoint": "/v1/chat/completions"}'
    r = httpx.post(
        served.url + "/v1/batches",
        content=body,
        headers={"Authorization": f"Bearer {STRONG_KEY}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text[:300]
    growth = {pid: _peak_rss(pid) - rss for pid, rss in before.items()}
    assert all(g < 5 * 1024 * 1024 for g in growth.values()), f"peak RSS growth by worker (bytes): {growth}"


def test_requests_gunicorn_refuses_before_the_app_answer_in_the_api_envelope(served):
    """A request line past gunicorn's limit_request_line, or a header past limit_request_field_size, is refused by
    gunicorn itself, before the app runs: the answer is still JSON in OpenAI's envelope, not an HTML page."""
    auth = {"Authorization": f"Bearer {STRONG_KEY}"}
    long_id = httpx.get(served.url + "/v1/batches/batch_" + "x" * 5000, headers=auth)
    huge_header = httpx.get(served.url + "/v1/files", headers={**auth, "X-Pad": "p" * 10_000})
    for r, status, code in ((long_id, 414, "request_line_too_long"), (huge_header, 431, "request_header_too_large")):
        assert r.status_code == status, r.text[:300]
        assert r.headers["content-type"] == "application/json", r.headers
        assert r.json()["error"]["code"] == code and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


JUNK_MB = 64  # per upload; see the test's docstring
JUNK_BODIES = {
    "no boundary": b"",  # all preamble: the decoder looks for the first boundary
    "headers that never end": b'--x\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n',
}


def _junk(head: bytes, size: int) -> t.Iterator[bytes]:
    """``head``, then junk to ``size`` bytes, made as it is sent: no CR, no LF, no boundary."""
    yield head
    chunk = b"j" * (1024 * 1024)
    left = size - len(head)
    while left > 0:
        yield chunk[:left]
        left -= len(chunk)


@pytest.mark.parametrize("serve_overrides", [{"api_threads": 4}])  # compose's 2 workers x 4 threads
def test_concurrent_junk_uploads_cost_the_api_a_bounded_buffer(served):
    """8 uploads at once (every thread of both workers) of junk under a valid multipart Content-Type: the decoder
    holds at most 320 KB per request outside a part's data, so the API's peak RSS grows by less than 32 MB.

    The bound does not depend on the body's size (werkzeug's decoder grows its buffer with the junk it is given;
    Tidal refuses past READ_BYTES + MAX_FIELD_BYTES), so 64 MB bodies prove what 512 MB ones would, in an eighth of
    the time on a shared 2-core machine: unbounded, 8 x 64 MB would grow the API by hundreds of MB, past 32 MB
    many times over.
    """
    _junk_uploads(served, 1)  # warm-up: every thread and its allocator arena, connection pools, lazy imports
    workers = served.workers()
    for w in workers:
        Path(f"/proc/{w.pid}/clear_refs").write_text("5")  # reset each worker's peak RSS to its RSS now
    before = sum(w.memory_info().rss for w in workers)
    _junk_uploads(served, JUNK_MB)
    growth = sum(_peak_rss(w.pid) for w in workers) - before
    assert growth < 32 * 1024 * 1024, f"the API's peak RSS grew by {growth / 2**20:.0f} MB"


def _junk_uploads(served: Served, megabytes: int) -> None:
    """8 junk uploads of ``megabytes`` each, sent at once; each must answer 400 in the envelope."""
    size = megabytes * 1024 * 1024
    heads = list(JUNK_BODIES.values()) * 4
    answers: list[httpx.Response | BaseException] = [RuntimeError("no answer")] * len(heads)
    go = threading.Barrier(len(heads))

    def upload(n: int) -> None:
        go.wait()
        try:
            answers[n] = httpx.post(
                served.url + "/v1/files",
                content=_junk(heads[n], size),
                headers={
                    "Authorization": f"Bearer {STRONG_KEY}",
                    "Content-Type": "multipart/form-data; boundary=x",
                    "Content-Length": str(size),
                },
                timeout=300,
            )
        except httpx.HTTPError as exc:
            answers[n] = exc

    threads = [threading.Thread(target=upload, args=(n,)) for n in range(len(heads))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for r in answers:
        assert isinstance(r, httpx.Response), repr(r)
        assert r.status_code == 400 and r.json()["error"]["code"] == "missing_required_parameter", r.text[:300]


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


def test_the_app_warns_outside_dev_mode_while_any_model_name_goes(rt, caplog):
    """An empty TIDAL_MODELS takes any model name, aliases and LoRA adapters included (issue 37 L14): said at start."""
    for env, models, warned in (("prod", "", True), ("prod", "tiny", False), ("dev", "", False)):
        runtime = Runtime(rt.settings.replace(env=env, models=models, api_keys=f"acme:{STRONG_KEY}"))
        caplog.clear()
        create_app(runtime=runtime)
        assert ("TIDAL_MODELS is empty" in caplog.text) is warned, (env, models)
        runtime.close()
