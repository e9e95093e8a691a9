"""Two frontier runs point by point (tidal_workers/bench/frontier_compare.py): the time-scale check of issue 35,
item 8, whose ratios hold at 1 when the twin's time scale bends nothing, and show what it does bend."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.support.bench_helpers import frontier_plan
from tests.support.bench_helpers import online_records
from tests.support.bench_helpers import point
from tests.support.bench_helpers import record
from tidal_workers.bench import frontier_compare as fc
from tidal_workers.bench import frontier_plan as fp
from tidal_workers.bench import frontier_report as fr
from tidal_workers.bench import samples
from tidal_workers.bench import stats
from tidal_workers.bench import steady
from tidal_workers.bench.cli import bench

pytestmark = pytest.mark.no_sql

PLAN = frontier_plan(techniques=("outside",), knobs={"outside": (8,)})
SLOW = dataclasses.replace(PLAN, time_scale=2.0)


def runs(arm_slow: float = 1.3, arm_tokens_per_s: float = 200.0) -> tuple[fr.Report, fr.Report]:
    """A run at k = 1 and one at k = 2 of the same points; the second's wall clock twice as long throughout."""
    base = [record(point(fp.ONLINE_ALONE)), record(point(fp.COSERVED))]
    arm = [
        record(point(fp.ONLINE_ALONE), wall=2.0),
        record(point(fp.COSERVED), slow=arm_slow, tokens_per_s=arm_tokens_per_s, wall=2.0),
    ]
    return fr.Report(PLAN, base), fr.Report(SLOW, arm)


def test_a_time_scale_that_bends_nothing_holds_every_ratio_at_one():
    entries = {e["name"]: e for e in fc.compare(*runs())}
    co = entries[point(fp.COSERVED).name]["figures"]
    assert set(co) == {"harvest", "ttft_p50_inflation", "ttft_p99_inflation", "tbt_p50_inflation", "tbt_p99_inflation"}
    for name, figure in co.items():
        assert figure["value"] == pytest.approx(1.0), name  # 200 a wall second at k = 2 is 400 the GPU's
        assert figure["within"], name
    alone = entries[point(fp.ONLINE_ALONE).name]["figures"]
    assert alone["ttft_p50"]["value"] == pytest.approx(1.0) and alone["tbt_p99"]["within"]
    assert entries[point(fp.COSERVED).name]["valid"] == {"base": True, "arm": True}


def test_what_the_cpu_bends_at_one_time_scale_falls_outside_the_tolerance():
    base, arm = runs(arm_slow=1.3 * 1.2, arm_tokens_per_s=160.0)
    co = {e["name"]: e for e in fc.compare(base, arm)}[point(fp.COSERVED).name]["figures"]
    assert co["harvest"]["value"] == pytest.approx(0.8) and not co["harvest"]["within"]
    assert co["ttft_p50_inflation"]["value"] == pytest.approx(1.2) and not co["ttft_p50_inflation"]["within"]
    assert co["ttft_p50_inflation"]["low"] > 1.1  # the shared requests keep the interval tight
    row = "| coserved__flat-8__standard__outside-8__r0 | harvest | 0.800 [0.800, 0.800] | no | yes / yes |"
    assert row in fc.table(fc.compare(base, arm))


def test_a_point_measured_in_one_run_only_is_left_out():
    base, arm = runs()
    lonely = fr.Report(PLAN, [record(point(fp.ONLINE_ALONE))])
    assert [e["name"] for e in fc.compare(lonely, arm)] == [point(fp.ONLINE_ALONE).name]
    assert fc.compare(base, fr.Report(SLOW, [])) == []


def test_the_joint_resampling_gives_a_ratio_of_inflations_and_the_powers_say_which_way():
    per_request = [samples.per_request(online_records(s))["tbt"] for s in (1.0, 1.3, 2.0, 2.6 * 1.1)]
    (ratio,) = stats.paired_quantile_products(per_request, [1, -1, -1, 1], [0.5], resamples=200)
    assert ratio is not None and ratio.value == pytest.approx(1.1) and ratio.low <= 1.1 <= ratio.high
    inverse = stats.paired_quantile_products(per_request[:2], [1, -1], [0.5, 0.99], resamples=200)
    assert [r.value for r in inverse if r] == pytest.approx([1 / 1.3, 1 / 1.3])  # base ÷ co: the powers say which
    with pytest.raises(ValueError, match="one power per arm"):
        stats.paired_quantile_products(per_request, [1, -1], [0.5])
    with pytest.raises(ValueError, match="same requests"):
        stats.paired_quantile_products([per_request[0], per_request[1][:10]], [-1, 1], [0.5])


def test_two_windows_rates_are_compared_with_their_blocks_resampled_apart():
    seconds = np.full(6, 10.0)
    noisy = np.array([900.0, 1100.0, 1000.0, 950.0, 1050.0, 1000.0])
    low, high = steady.ratio_of_ratios_interval((noisy, seconds), (np.full(6, 500.0), seconds)) or (0, 0)
    assert 1.8 < low < 2.0 < high < 2.2
    assert steady.ratio_of_ratios_interval((noisy[:2], seconds[:2]), (noisy, seconds)) is None


def test_the_command_compares_two_run_directories(tmp_path):
    for directory, plan, wall, tokens in ((tmp_path / "k1", PLAN, 1.0, 400.0), (tmp_path / "k2", SLOW, 2.0, 200.0)):
        run = fp.RunDir(directory)
        run.open(plan)
        for p in (point(fp.ONLINE_ALONE), point(fp.COSERVED)):
            run.write(p, record(p, wall=wall, tokens_per_s=tokens))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        bench, ["frontier-compare", str(tmp_path / "k1"), str(tmp_path / "k2"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output + result.stderr
    text = (out / "compare.md").read_text()
    assert "| coserved__flat-8__standard__outside-8__r0 | harvest | 1.000 [1.000, 1.000] | yes | yes / yes |" in text
    results = json.loads((out / "frontier-compare.json").read_text())
    assert results["arm"]["plan"]["time_scale"] == 2.0 and len(results["points"]) == 2
