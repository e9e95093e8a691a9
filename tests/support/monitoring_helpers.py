"""The shipped monitoring files, a real Prometheus process on them, and the plot of a run's panels."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import typing as t
from pathlib import Path

import requests
import yaml

from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "config" / "monitoring"
PROMETHEUS_YML = MONITORING / "prometheus.yml"
ALERTS_YML = MONITORING / "alerts.yml"
DASHBOARD_JSON = MONITORING / "grafana" / "dashboards" / "tidal.json"
ALERTS_TEST_YML = ROOT / "tests" / "monitoring" / "alerts_test.yml"
JOBS = ("tidal-api", "tidal-worker", "vllm", "tidal-scheduler")


def tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``; a missing one fails the test, it never skips it."""
    path = shutil.which(name)
    assert path, f"{name} is not installed: `apt-get install -y prometheus` (tests/run.sh installs it)"
    return path


def dashboard() -> dict:
    return json.loads(DASHBOARD_JSON.read_text())


def panel_queries(rate_interval: str) -> list[tuple[str, str, str]]:
    """(panel title, legend, PromQL expression) of every query of every panel, as Grafana sends it.

    Grafana replaces ``$__rate_interval`` by max(step + scrape interval, 4 × scrape interval): one minute at
    the default 15 s scrapes, 4 s at the 1 s scrapes of the test's run.
    """
    return [
        (p["title"], q["legendFormat"], q["expr"].replace("$__rate_interval", rate_interval))
        for p in dashboard()["panels"]
        for q in p["targets"]
    ]


def prometheus_config(targets: dict[str, str], rule_file: Path, scrape_seconds: float = 1.0) -> dict:
    """The shipped prometheus.yml with each job scraping ``targets[job]`` (host:port) and faster intervals."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == list(JOBS)
    config["global"] = {"scrape_interval": f"{scrape_seconds:g}s", "evaluation_interval": f"{scrape_seconds:g}s"}
    config["rule_files"] = [str(rule_file)]
    for job in config["scrape_configs"]:
        (group,) = job["static_configs"]
        group["targets"] = [targets[job["job_name"]]]
    return config


class Prometheus:
    """A real Prometheus server on loopback, its data in ``workdir``; the test stops its ``proc`` (``children``)."""

    def __init__(self, config: dict, workdir: Path, port: int):
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "prometheus.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    tool("prometheus"),
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait(lambda: requests.get(self.url + "/-/ready", timeout=2).status_code == 200, timeout, "ready")

    def wait(self, predicate: t.Callable[[], bool], timeout: float, what: str) -> None:
        """Until ``predicate`` holds (a refused connection is not yet); at once an error if Prometheus exited."""

        def holds() -> bool:
            assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            try:
                return predicate()
            except requests.ConnectionError:
                return False

        wait_for(holds, timeout, f"prometheus: {what}", every=0.2)

    def api(self, path: str, **params: t.Any) -> t.Any:
        r = requests.get(self.url + "/api/v1/" + path, params=params, timeout=30)
        body = r.json()
        assert body["status"] == "success", (path, params, body)
        return body["data"]


def finite_points(series: list[dict]) -> int:
    return sum(1 for s in series for _, v in s["values"] if math.isfinite(float(v)))


def plot_panels(results: list[dict], t0: float, path: Path) -> None:
    """One subplot per dashboard panel, each query's series as Prometheus's query API returned them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = list(dict.fromkeys(r["panel"] for r in results))
    cols = 2
    rows = math.ceil(len(titles) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.0 * rows), squeeze=False)
    for ax, title in zip(axes.flat, titles):
        drawn = False
        for r in (r for r in results if r["panel"] == title):
            for s in r["series"]:
                xs = [float(ts) - t0 for ts, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                label = r["legend"]
                for name, value in s["metric"].items():
                    label = label.replace("{{" + name + "}}", value)
                ax.plot(xs, ys, label=label, linewidth=1.2)
                drawn = True
            if not r["series"]:
                ax.text(0.5, 0.5, f"{r['legend']}: no series yet (pending metric)", ha="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        ax.tick_params(labelsize=8)
        if drawn:
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(titles) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
