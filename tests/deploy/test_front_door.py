"""The front door compose ships (config/nginx/tidal.conf.template, rendered with the `proxy` service's environment)
run by a real nginx with a throwaway self-signed certificate, in front of a real `tidal serve` on loopback.

Slow clients hold gunicorn's threads (gthread reads a request head and body with a blocking socket), so eight slow
uploads and eight slow request heads stop the API answering anyone. Through the proxy they hold only nginx
connections: the API sees each request once it is whole, and a head that is not whole in 10 s is dropped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import typing as t
from pathlib import Path

import pytest
import requests

from tests.support.deploy_helpers import ROOT
from tests.support.deploy_helpers import compose_config
from tests.support.wait import wait_for
from tests.support.worker_helpers import spawn
from tidal_engine.serve import free_port

KEY = "sk-door-eTGN3lhPwSGCbp1wQI7vIg0La-_vWIeAqTvu"  # production mode refuses weak keys
AUTH = {"Authorization": f"Bearer {KEY}"}
SLOW = 8  # of each kind: as many as the API has threads (1 worker x 8 threads: compose's 2 x 4, in one process)
STEP_S = 0.2  # a slow client's pause between two bytes
HEADER_TIMEOUT_S = 10  # client_header_timeout in the template


@pytest.fixture
def api(settings, rt, tmp_path, children):  # rt: an empty, migrated store
    """`tidal serve` (gunicorn) on a loopback port: the API the proxy stands in front of."""
    served = settings.replace(
        env="prod",
        api_keys=f"acme:{KEY}",
        bind=f"127.0.0.1:{free_port()}",
        metrics_bind="",
        api_workers=1,
        api_threads=8,
    )
    children.append(spawn(served, "serve", log=tmp_path / "serve.log"))
    url = f"http://{served.bind}"
    wait_for(lambda: _answers(url + "/health") or children[-1].poll() is not None, 60, "the API")
    assert children[-1].poll() is None, (tmp_path / "serve.log").read_text()
    return url


@pytest.fixture
def proxy(api, tmp_path, children):
    """nginx on the shipped template, TLS with a certificate made here, in front of ``api``."""
    nginx = shutil.which("nginx", path=f"{os.environ['PATH']}:/usr/sbin")
    assert nginx, "nginx is not installed: tests/run.sh installs Debian's `nginx` package"
    d = tmp_path / "nginx"
    d.mkdir()
    cert, key = d / "tidal.crt", d / "tidal.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    port = free_port()
    shipped = compose_config()["services"]["proxy"]["environment"]
    # The compose network's names and the container's paths become this machine's; the limits stay as shipped.
    env = {
        **shipped,
        "PROXY_LISTEN": f"127.0.0.1:{port}",
        "PROXY_UPSTREAM": api.removeprefix("http://"),
        "PROXY_TLS_CERT": str(cert),
        "PROXY_TLS_KEY": str(key),
    }
    (d / "tidal.conf").write_text(render(ROOT / "config/nginx/tidal.conf.template", env))
    (d / "nginx.conf").write_text(main_conf(d))
    with open(d / "nginx.out", "wb") as log:
        proc = subprocess.Popen(
            [nginx, "-p", str(d), "-e", str(d / "error.log"), "-c", str(d / "nginx.conf")], stdout=log, stderr=log
        )
    children.append(proc)
    url = f"https://127.0.0.1:{port}"
    wait_for(lambda: _answers(url + "/health", verify=str(cert)) or proc.poll() is not None, 15, "nginx")
    assert proc.poll() is None, (d / "nginx.out").read_text() + (d / "error.log").read_text()
    return Proxy(url, cert, int(env["PROXY_MAX_BODY_BYTES"]))


class Proxy(t.NamedTuple):
    url: str
    cert: Path
    max_body_bytes: int

    def connect(self) -> socket.socket:
        context = ssl.create_default_context(cafile=str(self.cert))
        host, port = self.url.removeprefix("https://").split(":")
        return context.wrap_socket(socket.create_connection((host, int(port)), timeout=5), server_hostname=host)


def render(template: Path, env: dict[str, str]) -> str:
    """What the nginx image's entrypoint does with a template: envsubst of the variables set, nginx's own lower-case
    `$variables` left alone."""
    text = template.read_text()
    for name, value in env.items():
        text = text.replace("${" + name + "}", value)
    assert "${" not in text, "the template reads a variable compose does not set"
    return text


def main_conf(d: Path) -> str:
    """The image's nginx.conf, reduced: the rendered file inside `http`, every path under ``d``."""
    kinds = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    temp = "".join(f"    {kind}_temp_path {d / kind};\n" for kind in kinds)
    user = "user root root;\n" if os.geteuid() == 0 else ""  # worker processes must reach ``d``
    return (
        f"daemon off;\nworker_processes 1;\npid {d / 'nginx.pid'};\n{user}events {{ worker_connections 256; }}\n"
        f"http {{\n    access_log {d / 'access.log'};\n{temp}    include {d / 'tidal.conf'};\n}}\n"
    )


def _answers(url: str, verify: str | bool = True) -> bool:
    try:
        return requests.get(url, timeout=2, verify=verify).status_code == 200
    except requests.RequestException:
        return False


class SlowClient(threading.Thread):
    """Sends ``head`` at once, then ``slow`` a byte every STEP_S, until ``seconds`` have passed or the server
    hangs up (``cut_after``: seconds from the first byte until it did)."""

    def __init__(self, sock: socket.socket, head: bytes, slow: bytes, seconds: float):
        super().__init__(daemon=True)
        self.sock, self.head, self.slow, self.seconds = sock, head, slow, seconds
        self.cut_after: float | None = None

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.sock.sendall(self.head)
            for byte in self.slow:
                if time.monotonic() - start > self.seconds:
                    return
                self.sock.sendall(bytes([byte]))
                if self._hung_up():
                    self.cut_after = time.monotonic() - start
                    return
        except OSError:  # a reset, or a TLS alert, while sending
            self.cut_after = time.monotonic() - start
        finally:
            self.sock.close()

    def _hung_up(self) -> bool:
        self.sock.settimeout(STEP_S)
        try:
            return self.sock.recv(4096) == b""  # b"": the server closed the connection
        except TimeoutError:  # nothing to read for STEP_S: still open
            return False
        except (OSError, ssl.SSLError):
            return True
        finally:
            self.sock.settimeout(5)


def slow_clients(connect: t.Callable[[], socket.socket], seconds: float) -> tuple[list[SlowClient], list[SlowClient]]:
    """SLOW slow request heads and SLOW slow uploads (authenticated, so the API reads their bodies), started."""
    heads = [SlowClient(connect(), b"", b"GET /v1/files HTTP/1.1\r\nHost: tidal\r\nX-Pad: " + b"a" * 400, seconds)]
    heads += [SlowClient(connect(), b"", heads[0].slow, seconds) for _ in range(SLOW - 1)]
    upload_head = (
        "POST /v1/files HTTP/1.1\r\nHost: tidal\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    uploads = [SlowClient(connect(), upload_head, b"x" * 1000, seconds) for _ in range(SLOW)]
    for client in heads + uploads:
        client.start()
    return heads, uploads


def _timed_get(url: str, timeout: float, **kw: t.Any) -> float:
    """Seconds GET ``url`` took to answer 200."""
    start = time.monotonic()
    r = requests.get(url, headers=AUTH, timeout=timeout, **kw)
    assert r.status_code == 200, r.text
    return time.monotonic() - start


@pytest.mark.timeout(90)
def test_slow_clients_hold_the_api_but_not_the_api_behind_the_front_door(api, proxy):
    # Straight to gunicorn: the slow clients take every thread, and a ninth request waits for them.
    host, port = api.removeprefix("http://").split(":")
    heads, uploads = slow_clients(lambda: socket.create_connection((host, int(port)), timeout=5), seconds=5)
    time.sleep(1)
    with pytest.raises(requests.ReadTimeout):
        requests.get(api + "/v1/files", headers=AUTH, timeout=2)
    for client in heads + uploads:
        client.join()
    assert _timed_get(api + "/v1/files", timeout=15) < 15  # once they leave, the API answers again

    # Through the front door: the same clients hold only nginx connections.
    seconds = HEADER_TIMEOUT_S + 2
    heads, uploads = slow_clients(proxy.connect, seconds=seconds)
    time.sleep(1)
    for _ in range(3):  # held, it would wait until the slow clients leave, 10 s on
        assert _timed_get(proxy.url + "/v1/files", timeout=5, verify=str(proxy.cert)) < 3
        time.sleep(2)
    for client in heads + uploads:
        client.join()
    cut = [c.cut_after for c in heads]
    assert all(c is not None and HEADER_TIMEOUT_S - 1 < c < seconds for c in cut), cut  # the header read timeout
    assert all(c.cut_after is None for c in uploads)  # a body may pause up to 30 s between reads


def test_the_front_door_passes_uploads_and_refuses_a_body_past_the_apis_limit_in_json(proxy):
    tls = {"headers": AUTH, "verify": str(proxy.cert), "timeout": 10}
    up = requests.post(proxy.url + "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", b"{}\n")}, **tls)
    assert up.status_code == 200, up.text
    assert [f["id"] for f in requests.get(proxy.url + "/v1/files", **tls).json()["data"]] == [up.json()["id"]]

    # Refused on its Content-Length alone, before a byte of the body is read; the API's own bound is the same one.
    with contextlib.closing(proxy.connect()) as sock:
        sock.sendall(
            f"POST /v1/files HTTP/1.1\r\nHost: tidal\r\nContent-Length: {proxy.max_body_bytes + 1}\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
            if b"}}" in answer:
                break
    head, _, body = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413") and "application/json" in head, head
    assert '"code": "request_too_large"' in body and str(proxy.max_body_bytes) in body, body
