"""A tiny OpenAI-protocol HTTP server on loopback, only for fault injection (5xx, 429, 4xx, hangs, aborts).

It answers /v1/chat/completions, /v1/completions and /v1/embeddings with a
usage block, /tokenize with one token a character of the request's key, and lists ``models`` (``["m"]`` unless a test changes it) at /v1/models. A request is identified by its first message's content (the
tests put the custom_id there; a prompt of token ids is a staged prefill's
warm-up, keyed ``WARMUP``); ``script(key, *faults)`` queues faults that
the next requests for that key get, in order, before it answers normally.
``metrics`` is what GET /metrics answers (an idle engine's series by default):
a test steers an AIMD gate pointed here by replacing it. The worker's preflight
probes are counted in ``probes``, not ``requests``; ``refuse_priority`` makes the
stub answer every request carrying ``priority`` 400, as an engine without
priority scheduling that refuses the field would. ``deadly`` names requests that
kill the engine: each drops its connection, and the engine is down (``outage``)
for ``restart_seconds``, then answers again, as vLLM restarted by its supervisor.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

from tidal_workers.preflight import PROBE_PROMPT

WARMUP = "warmup"  # the key of every request whose prompt is token ids (staged prefill's warm-ups)
FAULTS = ("500", "503", "429", "400", "hang", "abort", "huge")


def metrics_text(kv_usage: float = 0.1, waiting: int = 0, running: int = 0, preemptions: int = 0) -> str:
    """The /metrics series an AIMD gate reads, with the given values."""
    return (
        f'vllm:kv_cache_usage_perc{{engine="0"}} {kv_usage}\n'
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        f'vllm:num_preemptions_total{{engine="0"}} {preemptions}\n'
    )


class StubEngine:
    def __init__(self, delay: float = 0.0):
        self.delay = delay  # seconds before every normal answer
        self.requests: list[dict] = []  # bodies received, in order
        self.metrics = metrics_text()  # what GET /metrics answers; a test may replace it to steer a gate
        self.scrapes = 0  # GET /metrics answered so far: a gate pointed here is running
        self.health = 200  # what GET /health answers; a test makes the engine look down by changing it
        self.health_checks = 0  # GET /health answered so far
        self.outage = False  # True: /health and every POST answer 503, as an engine that is down behind a proxy
        self.models = ["m"]  # what GET /v1/models lists: the batches of these models are claimed by its workers
        self.refuse_priority = False  # True: a request carrying `priority` is answered 400 naming it
        self.probes = 0  # the worker's preflight probes answered so far (they are not in ``requests``)
        self.deadly: set[str] = set()  # keys of requests that kill the engine
        self.restart_seconds = 0.3  # how long a killed engine stays down
        self.deaths = 0  # times a deadly request killed it
        self.tokenized: list[dict] = []  # bodies POSTed to /tokenize (staged prefill), not in ``requests``
        self._faults: dict[str, list[str]] = {}
        self._answering = threading.Event()  # cleared by hold_answers(): normal answers wait until it is set
        self._answering.set()
        self._held: list[str] = []  # keys of the requests whose answers wait for release_answers()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def script(self, key: str, *faults: str) -> None:
        assert all(f in FAULTS for f in faults), faults
        with self._lock:
            self._faults.setdefault(key, []).extend(faults)

    def seen(self, key: str) -> int:
        with self._lock:
            return sum(1 for body in self.requests if _key(body) == key)

    def hold_answers(self) -> None:
        """Answer no request (received now or later) until release_answers(); ``held()`` lists the waiting ones, so
        a test can act while a chosen request is in flight and cannot settle."""
        self._answering.clear()

    def held(self) -> set[str]:
        """The keys of the requests held unanswered now."""
        with self._lock:
            return set(self._held)

    def release_answers(self) -> None:
        self._answering.set()

    def die(self) -> None:
        """The engine dies: down (``outage``) for ``restart_seconds``, then up again."""
        with self._lock:
            self.deaths += 1
            self.outage = True
        timer = threading.Timer(self.restart_seconds, lambda: setattr(self, "outage", False))
        timer.daemon = True
        timer.start()

    def close(self) -> None:
        self._closing.set()
        self._answering.set()
        self.server.shutdown()
        self.server.server_close()

    def _next(self, body: dict) -> str | None:
        with self._lock:
            self.requests.append(body)
            queued = self._faults.get(_key(body))
            return queued.pop(0) if queued else None

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send_json(self, payload: dict) -> None:
                """A 200 with ``payload`` as its JSON body."""
                raw = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):  # /metrics (an idle engine's unless scripted), for an AIMD gate pointed here
                if self.path == "/health":  # vLLM's liveness: 200 and no body
                    stub.health_checks += 1
                    self.send_response(503 if stub.outage else stub.health)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/v1/models":  # vLLM's list of served models
                    self.send_json({"object": "list", "data": [{"id": m, "object": "model"} for m in stub.models]})
                    return
                raw = stub.metrics.encode()
                stub.scrapes += 1
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":  # one token a character of the request's key
                    with stub._lock:
                        stub.tokenized.append(body)
                    n = len(_key(body))
                    self.send_json({"count": n, "max_model_len": 4096, "tokens": list(range(n))})
                    return
                if body.get("prompt") == PROBE_PROMPT:
                    stub.probes += 1
                    fault = None
                else:
                    fault = stub._next(body)  # recorded, and a scripted fault used, in an outage too
                fault = "503" if stub.outage else fault
                if fault is None and _key(body) in stub.deadly:
                    stub.die()
                    fault = "abort"
                if stub.refuse_priority and "priority" in body and fault is None:
                    fault = "priority"
                if fault == "abort":
                    self.connection.shutdown(2)  # no response at all: a connection error for the client
                    return
                if fault == "hang":
                    stub._closing.wait(30)
                    return
                if fault == "priority":  # the words of the vLLM releases that refused it
                    status = 400
                    payload = {
                        "error": {
                            "message": f"Got priority {body['priority']} but Priority scheduling is not enabled.",
                            "type": "BadRequestError",
                            "param": None,
                            "code": 400,
                        }
                    }
                elif fault in ("500", "503", "429", "400"):
                    status = int(fault)
                    payload = {
                        "error": {
                            "message": f"stub fault {status}",
                            "type": "BadRequestError",
                            "param": None,
                            "code": status,
                        }
                    }
                else:
                    if not stub._answering.is_set():
                        with stub._lock:
                            stub._held.append(_key(body))
                        stub._answering.wait(60)
                        with stub._lock:
                            stub._held.remove(_key(body))
                    time.sleep(stub.delay)
                    status, payload = 200, _answer(self.path, body)
                    if fault == "huge":  # a 1 MB answer, its usage last, as vLLM writes a long logprobs answer
                        payload["choices"][0]["message"]["content"] = "x" * 2**20
                        payload["usage"] = payload.pop("usage")
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.send_header("x-request-id", f"req-{len(stub.requests)}")
                self.end_headers()
                self.wfile.write(raw)

        return Handler


def _key(body: dict) -> str:
    if "messages" in body:
        return body["messages"][0]["content"]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return WARMUP  # token ids: a staged prefill's warm-up
    return str(prompt or body.get("input"))


def _answer(path: str, body: dict) -> dict:
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    if path.endswith("/embeddings"):
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.0, 1.0]}],
            "model": body.get("model"),
            "usage": {"prompt_tokens": 7, "total_tokens": 7},
        }
    text = f"echo {_key(body)}"
    if path.endswith("/completions") and "chat" not in path:
        return {
            "id": "cmpl-stub",
            "object": "text_completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
            "usage": usage,
        }
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": usage,
    }
