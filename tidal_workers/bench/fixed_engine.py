"""A fixed-time OpenAI-protocol engine: a benchmark instrument for dispatch, not a model.

Every POST is answered after exactly ``delay`` seconds, with a usage block of
``max_tokens`` completion tokens, however many requests it holds (an engine
with unbounded slots), so what a benchmark sees is Tidal's dispatch alone. It
keeps the time-weighted mean of the requests it holds (the "requests at the
engine" the gate's target is meant to fill) and answers GET /metrics with the
series the AIMD gate reads, so a worker's gate and preflight work against it.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

MODEL = "fixed"  # the one model it serves (what the dispatch benchmark's batches name)
PROMPT_TOKENS = 16


class Occupancy:
    """Requests held over time: the integral of the count, read as a mean over a window (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._area = 0.0  # request-seconds since start
        self._at = time.monotonic()
        self.answered = 0

    def _advance(self) -> None:
        now = time.monotonic()
        self._area += self._held * (now - self._at)
        self._at = now

    def enter(self) -> None:
        with self._lock:
            self._advance()
            self._held += 1

    def leave(self) -> None:
        with self._lock:
            self._advance()
            self._held -= 1
            self.answered += 1

    def mark(self) -> tuple[float, float, int]:
        """(now, request-seconds so far, answered so far): two marks give a window's mean and rate."""
        with self._lock:
            self._advance()
            return self._at, self._area, self.answered

    @property
    def held(self) -> int:
        with self._lock:
            return self._held


class FixedEngine:
    def __init__(self, delay: float, port: int = 0):
        self.delay = delay
        self.model = MODEL
        self.occupancy = Occupancy()
        self.trace = None  # no twin: no step trace
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.server.request_queue_size = 512
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fixed-engine", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server: a pooled client reuses connections
            # TCP_NODELAY, as uvicorn's (asyncio's) sockets: without it the body, written after the headers, waits
            # for the client's delayed ACK (40 ms on Linux) on every answer, which the engine's time does not show.
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    held = engine.occupancy.held
                    text = (
                        'vllm:kv_cache_usage_perc{engine="0"} 0.1\n'
                        'vllm:num_requests_waiting{engine="0"} 0\n'
                        f'vllm:num_requests_running{{engine="0"}} {held}\n'
                        'vllm:num_preemptions_total{engine="0"} 0\n'
                    )
                    self._send(200, text.encode(), "text/plain; version=0.0.4")
                elif self.path == "/v1/models":  # a node claims only the models its engine lists here
                    self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
                else:
                    self._send(200, b"{}")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                engine.occupancy.enter()
                try:
                    time.sleep(engine.delay)
                finally:
                    engine.occupancy.leave()
                completion = int(body.get("max_tokens") or 16)
                answer = {
                    "id": f"fixed-{time.monotonic_ns()}",
                    "object": "chat.completion",
                    "model": body.get("model", MODEL),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
                    ],
                    "usage": {
                        "prompt_tokens": PROMPT_TOKENS,
                        "completion_tokens": completion,
                        "total_tokens": PROMPT_TOKENS + completion,
                    },
                }
                self._send(200, json.dumps(answer).encode())

        return Handler
