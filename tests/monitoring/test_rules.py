"""The shipped alert rules, dashboard and Prometheus configuration, checked by promtool (Debian's prometheus).

promtool must be installed (tests/run.sh installs Debian's `prometheus` package); without it these tests fail.
"""

from __future__ import annotations

import subprocess

import yaml

from tests.support.monitoring_helpers import ALERTS_TEST_YML
from tests.support.monitoring_helpers import ALERTS_YML
from tests.support.monitoring_helpers import DASHBOARD_JSON
from tests.support.monitoring_helpers import JOBS
from tests.support.monitoring_helpers import ROOT
from tests.support.monitoring_helpers import dashboard
from tests.support.monitoring_helpers import panel_queries
from tests.support.monitoring_helpers import prometheus_config
from tests.support.monitoring_helpers import tool

ALERTS = {
    "TidalUnfilledSlack",
    "TidalBatchLaxityNegative",
    "TidalPreflightFailing",
    "TidalEngineCrashItem",
    "TidalWorkerLostItem",
    "TidalFinalizeFailed",
    "TidalGateStuckAtZero",
    "TidalOnlineLatencyOverBudget",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_alert_rules_pass_promtool_check():
    out = promtool("check", "rules", str(ALERTS_YML))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in out.stdout
    rules = yaml.safe_load(ALERTS_YML.read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == ALERTS


def test_alert_rules_pass_their_unit_tests():
    out = promtool("test", "rules", str(ALERTS_TEST_YML))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_tested_firing_and_quiet():
    cases = [case for test in yaml.safe_load(ALERTS_TEST_YML.read_text())["tests"] for case in test["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == ALERTS
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == ALERTS


def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each panel's query as a recording rule: a typo fails here, not in Grafana."""
    rules = {
        "groups": [
            {
                "name": "panels",
                "rules": [
                    {"record": f"panel:{i}", "expr": e} for i, (*_, e) in enumerate(panel_queries(rate_interval="1m"))
                ],
            }
        ]
    }
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(rules))
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_uses_the_provisioned_datasource():
    datasource = yaml.safe_load((DASHBOARD_JSON.parents[1] / "provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    board = dashboard()
    assert board["uid"] == "tidal" and len(board["panels"]) >= 6
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]


def test_prometheus_config_passes_promtool_check(tmp_path):
    config = prometheus_config(dict.fromkeys(JOBS, "127.0.0.1:1"), ALERTS_YML)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    out = promtool("check", "config", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
