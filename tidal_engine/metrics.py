"""TidalScheduler's state as Prometheus metrics, served from the engine-core process.

The scheduler lives in vLLM's engine-core process, which has no HTTP server of
its own; prometheus_client's ``start_http_server`` adds one on
``TIDAL_SCHED_METRICS_PORT`` (0 = off) so workers and dashboards can read the
plugin next to vLLM's own /metrics. Each scheduler has its own registry, so
several in one process (tests) do not collide.
"""

from __future__ import annotations

import enum

from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Gauge
from prometheus_client import start_http_server


class Mode(str, enum.Enum):
    MODEL = "model"  # the latency model is trusted and sets the cap
    STATIC = "static"  # online traffic present, model untrusted: a fixed share of τ
    NO_ONLINE = "no_online"  # nothing to protect: batch may use the whole step
    RELATIVE = "relative"  # alpha_set × T̂(online work alone), batch priced request by request


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.slack_fill_ratio = Gauge(
            "tidal_sched_slack_fill_ratio",
            "Batch tokens scheduled / batch cap X, over steps with online traffic in which batch work waited.",
            registry=r,
        )
        self.slack_offered_tokens = Counter(
            "tidal_sched_slack_offered_tokens",
            "Batch-cap tokens offered while online traffic was present and batch work waited (the fill ratio's "
            "denominator: 1 - rate(starved) / rate(offered) is the fill over any window).",
            registry=r,
        )
        self.starved_slack_tokens = Counter(
            "tidal_sched_starved_slack_tokens",
            "Batch-cap tokens left unused while online traffic was present and batch work waited.",
            registry=r,
        )
        self.starved_slack_seconds = Counter(
            "tidal_sched_starved_slack_seconds",
            "Step-budget seconds left unused while online traffic was present and batch work waited.",
            registry=r,
        )
        self.batch_cap = Gauge("tidal_sched_batch_cap_tokens", "Batch cap X of the last step.", registry=r)
        self.mode = Gauge("tidal_sched_mode", "1 for the mode of the last step.", ["mode"], registry=r)
        self.guardband = Gauge("tidal_sched_kv_guardband", "KV guardband H (fraction of the KV pool).", registry=r)
        self.r2 = Gauge("tidal_sched_model_r2", "R² of the latency model's last fit.", registry=r)
        self.online_waiting = Gauge("tidal_sched_online_waiting", "Online (priority 0) requests waiting.", registry=r)
        self.evictions = Counter("tidal_sched_evictions", "Batch requests evicted by the KV guardband.", registry=r)
        self.slot_yields = Counter(
            "tidal_sched_slot_yields",
            "Batch requests preempted so that online requests waiting for a slot get one (every slot was taken).",
            registry=r,
        )
        # Per-step accounting of what the gate decided (tests/e2e/test_plugin_accounting.py reads it).
        self.batch_tokens = Counter("tidal_sched_batch_tokens", "Tokens scheduled for batch requests.", registry=r)
        self.online_tokens = Counter("tidal_sched_online_tokens", "Tokens scheduled for online requests.", registry=r)
        self.capped_steps = Counter(
            "tidal_sched_capped_steps", "Steps with online traffic in which batch tokens reached the cap X.", registry=r
        )
        self.batch_over_cap_tokens = Counter(
            "tidal_sched_batch_over_cap_tokens",
            "Batch tokens scheduled past a step's cap X; only online's unused reservation can supply them "
            "(online prompts that hit the prefix cache), so a step's total stays inside its budget.",
            registry=r,
        )
        self.online_deferred_tokens = Counter(
            "tidal_sched_online_deferred_tokens",
            "Online tokens a step left unscheduled (chunked, or no free slot or KV for a waiting request).",
            registry=r,
        )
        self.online_preempted = Counter(
            "tidal_sched_online_preempted",
            "Online requests preempted by vLLM (KV exhausted with no batch request left to preempt).",
            registry=r,
        )
        self.steps = Counter("tidal_sched_steps", "Steps scheduled.", registry=r)
        # The relative budget (TIDAL_SCHED_ALPHA_SET).
        self.alpha_set = Gauge(
            "tidal_sched_alpha_set",
            "The budget multiplier: a step may take this times its online work alone.",
            registry=r,
        )
        self.reference_step_seconds = Gauge(
            "tidal_sched_reference_step_seconds",
            "T̂ of the last budgeted step's online work alone, at the online concurrency of online alone, with the "
            "host's time.",
            registry=r,
        )
        self.inflation = Gauge(
            "tidal_sched_inflation",
            "Measured cycle (one schedule() to the next) over the reference (tidal_sched_reference_step_seconds), "
            "smoothed over about 50 budgeted steps.",
            registry=r,
        )
        self.host_seconds = Gauge(
            "tidal_sched_host_seconds",
            "The host's time a cycle takes beyond T̂, fitted over about 1,000 cycles: per step (part=step) and per "
            "request the step carries (part=request).",
            ["part"],
            registry=r,
        )
        self.host_step_seconds = self.host_seconds.labels("step")  # the children, looked up once: set every step
        self.host_request_seconds = self.host_seconds.labels("request")
        self.working_set = Gauge("tidal_sched_working_set", "Batch requests scheduled in the last step.", registry=r)
        self.batch_resident = Gauge(
            "tidal_sched_batch_resident",
            "Batch requests holding KV after the last budgeted step: the working set and the parked.",
            registry=r,
        )
        self.park_releases = Counter(
            "tidal_sched_park_releases",
            "Batch requests preempted after sitting out longer than TIDAL_SCHED_MAX_PARK_SECONDS (KV freed).",
            registry=r,
        )
        self._mode: Mode | None = None

    def set_mode(self, mode: Mode) -> None:
        if mode is not self._mode:
            for m in Mode:
                self.mode.labels(m.value).set(1.0 if m is mode else 0.0)
            self._mode = mode

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
