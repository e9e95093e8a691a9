"""`tidal bench virtual`: the real schedulers in virtual time, each step the profile's T(P, C, pairs)."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner

from tidal_workers.bench.cli.engine_runs import virtual


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Online alone, TidalScheduler at α_set 1.2, vLLM alone with 8 batch requests and the latency gate at α_set
    1.2, 40 virtual seconds each."""
    out = tmp_path_factory.mktemp("virtual")
    args = [
        "--alphas",
        "1.2",
        "--peer-concurrency",
        "8",
        "--latency-gate-alphas",
        "1.2",
        "--seeds",
        "1",
        "--seconds",
        "40",
    ]
    result = CliRunner().invoke(virtual, [*args, "--warmup-seconds", "20", "--lead-seconds", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "virtual.json").read_text())


def test_online_alone_and_each_arm_run_on_the_same_trace(report):
    inside, peer = report["runs"]["inside-1.2"][0], report["runs"]["vllm-priority-8"][0]
    assert inside["alone"] == peer["alone"]  # one trace per seed, online alone measured once on it
    alone = inside["alone"]
    assert alone["harvest_tokens_per_s"] == 0 and alone["online_requests"] > 100  # 8/s over 20 s
    assert 0.02 < alone["tbt_p50_s"] < 0.05  # an A6000 decode step beside ~40 online requests
    assert report["git_commit"] and report["argv"]


def test_the_relative_budget_holds_every_step_and_harvests_within_the_oracle(report):
    run = report["runs"]["inside-1.2"][0]
    assert run["co"]["harvest_tokens_per_s"] > 50
    # every step within 1.2 × its online work alone (the prompt steps within less), so TBT p50 too, within the
    # difference that the online requests running grow with the step time
    assert 1.0 < run["inflation"]["tbt_p50"] <= 1.25
    assert 0 < run["E"] <= 1.05 and run["oracle_tokens_per_s"] > run["co"]["harvest_tokens_per_s"] * 0.95
    assert set(run["co"]["steps"]) == {"prompt", "decode"}
    summary = report["summary"]["inside-1.2"]
    assert summary["harvest_tokens_per_s"]["value"] == run["co"]["harvest_tokens_per_s"]  # one seed: the mean alone


def test_vllm_alone_keeps_its_batch_concurrency(report):
    run = report["runs"]["vllm-priority-8"][0]
    steps = run["co"]["steps"]
    assert 0 < steps["decode"]["batch_decodes"] <= 8
    assert run["co"]["harvest_tokens_per_s"] > 0


def test_the_latency_gate_reads_the_engine_every_period_and_moves_its_target(report):
    run = report["runs"]["outside-latency-1.2"][0]
    readings = run["co"]["gate_readings"]  # (time, ITL read, smoothed inflation, target, batch at the engine)
    assert len(readings) >= 30  # one a virtual second from the batch's arrival (5 s) to the end (40 s)
    assert all(1 <= later[0] - earlier[0] < 1.2 for earlier, later in itertools.pairwise(readings))
    targets = {target for _, _, _, target, _ in readings}
    assert len(targets) > 1 and min(targets) >= 0 and max(targets) <= 185  # it moves, under the gate's ceiling
    assert all(at_engine <= max(targets) for *_, at_engine in readings)
    assert run["co"]["harvest_tokens_per_s"] > 0
