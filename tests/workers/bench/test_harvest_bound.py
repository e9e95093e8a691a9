"""The compute bound on harvest (`tidal bench bound`): what a GPU profile computes beside an online load."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tidal_engine.twin import load_profile
from tidal_workers.bench.cli import bench
from tidal_workers.bench.harvest_bound import Mix
from tidal_workers.bench.harvest_bound import compute_bound

pytestmark = pytest.mark.no_sql

A6000 = load_profile("qwen2.5-7b@a6000")


def test_online_traffic_takes_its_tokens_of_the_compute_and_batch_gets_the_rest_per_generated_token():
    mix = Mix(online_rate=8, online_prompt=300, online_output=150, batch_prompt=900, batch_output=450)
    b = compute_bound(A6000, mix)
    compute = A6000.flops / (2 * A6000.non_embedding_params)  # 92.9 TFLOP/s over 2 x 6.53 B FLOPs a token
    assert b.compute_tokens_per_s == pytest.approx(compute) and 7_000 < compute < 7_200
    assert b.online_tokens_per_s == 8 * 450
    assert b.batch_tokens_per_s == pytest.approx((compute - 3_600) / 3)  # 900 + 450 computed for 450 generated
    assert b.alone_tokens_per_s == pytest.approx(compute / 3)
    assert b.online_share == pytest.approx(3_600 / compute)
    assert b.harvest(2 * b.batch_tokens_per_s) == pytest.approx(0.5)


def test_an_online_load_past_the_compute_leaves_batch_nothing():
    mix = Mix(online_rate=20, online_prompt=300, online_output=150, batch_prompt=900, batch_output=450)
    assert compute_bound(A6000, mix).batch_tokens_per_s == 0.0  # 9,000 tokens/s of online work alone


def test_the_command_writes_each_rates_bound_and_its_share_of_a_measured_ceiling(tmp_path):
    result = CliRunner().invoke(bench, ["bound", "--online-rate", "8,20", "--ceiling", "2630", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "bound.json").read_text())
    eight, twenty = saved["rows"]
    assert saved["profile"] == "qwen2.5-7b@a6000" and "git_commit" in json.dumps(saved)
    assert (eight["online_rate"], twenty["online_rate"]) == (8.0, 20.0)
    assert 0.3 < eight["harvest_bound"] < 0.6 and twenty["batch_tokens_per_s"] == 0.0
