"""The frontier's figures from point records (tidal_workers/bench/frontier_report.py): verdicts with their reasons,
harvest, paired inflations, α_m and E against the oracle, the table and the aggregates."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from tests.support.bench_helpers import STEADY
from tests.support.bench_helpers import frontier_plan
from tests.support.bench_helpers import online_records
from tests.support.bench_helpers import point
from tests.support.bench_helpers import record
from tidal_workers.bench import efficiency
from tidal_workers.bench import frontier_plan as fp
from tidal_workers.bench import frontier_report as fr
from tidal_workers.bench import samples
from tidal_workers.bench.cli import bench

pytestmark = pytest.mark.no_sql

PLAN = frontier_plan(techniques=("outside",), knobs={"outside": (8,)}, reps=3)


def rows_of(records: list[dict]) -> dict[str, dict]:
    """The report's rows by kind (one point of each kind)."""
    return {r["kind"]: r for r in fr.Report(PLAN, records).rows()}


def test_a_steady_point_gets_its_harvest_inflations_and_e():
    records = [
        record(point(fp.CEILING), tokens_per_s=1700.0),
        record(point(fp.ONLINE_ALONE)),
        record(point(fp.COSERVED)),
    ]
    report = fr.Report(PLAN, records)
    rows = {r["kind"]: r for r in report.rows()}
    row = rows[fp.COSERVED]
    assert row["valid"], row["reasons"]
    assert row["harvest"]["value"] == pytest.approx(400.0)
    assert row["harvest"]["low"] == pytest.approx(400.0)  # a constant rate: every resample of its blocks
    assert row["inflation"]["ttft_p50"]["value"] == pytest.approx(1.3)
    assert row["inflation"]["tbt_p99"]["value"] == pytest.approx(1.3)
    assert row["alpha_m"] == pytest.approx(1.3)
    h_star = report.oracles("standard").h_star(1.3, 8.0)
    assert row["h_star"] == pytest.approx(h_star)
    assert row["E"]["value"] == pytest.approx(400.0 / h_star)
    assert row["pct_measured_ceiling"] == pytest.approx(100 * 400 / 1700)
    assert rows[fp.CEILING]["valid"] and rows[fp.ONLINE_ALONE]["valid"]


def test_a_window_shorter_than_its_online_alone_one_is_paired_on_the_first_requests_of_the_trace():
    """Online alone runs the longest window; a co-served one that closed earlier sent the trace's first requests."""
    co = record(point(fp.COSERVED))
    co["online"]["records"] = co["online"]["records"][:200]
    alone = record(point(fp.ONLINE_ALONE))
    assert fr.inflations(co, alone)["ttft_p50"].value == pytest.approx(1.3)
    assert fr.inflations(co, alone)["ttft_p50"].reps == 200
    with pytest.raises(ValueError, match="more online requests"):
        fr.inflations(alone, co)


def test_a_step_load_point_reports_the_instant_against_its_alpha_set_and_is_not_held_to_a_steady_ratio():
    plan = frontier_plan(loads=("step-1-8",), techniques=("inside",), knobs={"inside": (1.1,)})
    alone = record(fp.Point(fp.ONLINE_ALONE, "standard", 0, "step-1-8"))
    co = record(fp.Point(fp.COSERVED, "standard", 0, "step-1-8", "inside", 1.1), ratio=0.7 * STEADY)
    for r, slow in ((alone, 1.0), (co, 1.3)):  # 100 s of the trace: the step comes 60 s in
        r["online"]["records"] = online_records(slow, n=800)
    rows = {r["kind"]: r for r in fr.Report(plan, [alone, co]).rows()}
    row = rows[fp.COSERVED]
    assert row["valid"], row["reasons"]  # a step moves the batch on purpose: no prefill-ratio rule
    assert row["step"]["recovered"] == pytest.approx(1.3, rel=0.01) and row["step"]["holds"] is False
    assert "the instant, inside 1.1 (step-1-8, standard)" in fr.table({"rows": [row]})


def test_three_repetitions_of_a_step_load_give_the_instants_means_with_their_t_intervals():
    plan = frontier_plan(loads=("step-1-8",), techniques=("inside",), knobs={"inside": (1.1,)}, reps=3)
    records = []
    for rep, slow in enumerate((1.2, 1.3, 1.4)):
        alone = record(fp.Point(fp.ONLINE_ALONE, "standard", rep, "step-1-8"))
        co = record(fp.Point(fp.COSERVED, "standard", rep, "step-1-8", "inside", 1.1), ratio=0.7 * STEADY)
        for r, s in ((alone, 1.0), (co, slow)):
            r["online"]["records"] = online_records(s, n=800)
        records += [alone, co]
    results = fr.Report(plan, records).results()
    (agg,) = results["aggregates"]
    assert agg["instant_recovered"]["value"] == pytest.approx(1.3, rel=0.01)
    assert agg["instant_recovered"]["t_high"] == pytest.approx(1.3 + 4.303 * 0.1 / 3**0.5, rel=0.01)
    line = "- the instant over 3 repetitions, inside 1.1 (step-1-8, standard): online ITL p50 inflation "
    text = fr.table(results)
    assert line in text and "1.299 [1.052, 1.547] (TTFT p50 1.300 [1.052, 1.548]) over the 10 s" in text


def test_a_time_scaled_run_reports_harvest_and_latencies_in_the_gpu_s_seconds():
    """Run k = 2 times slower, a window harvests half as many tokens a wall second, and every latency doubles."""
    slow_plan = dataclasses.replace(PLAN, time_scale=2.0)
    alone, co = record(point(fp.ONLINE_ALONE)), record(point(fp.COSERVED), tokens_per_s=200.0)
    rows = {r["kind"]: r for r in fr.Report(slow_plan, [alone, co]).rows()}
    assert rows[fp.COSERVED]["harvest"]["value"] == pytest.approx(400.0)
    assert rows[fp.COSERVED]["inflation"]["ttft_p50"]["value"] == pytest.approx(1.3)  # ratios: as they are
    wall = samples.summary(alone["online"]["records"])["ttft_p50"]
    assert rows[fp.ONLINE_ALONE]["online"]["ttft_p50"] == pytest.approx(wall / 2)


def test_small_inflations_are_judged_at_alpha_1_10():
    records = [record(point(fp.ONLINE_ALONE)), record(point(fp.COSERVED), slow=1.02)]
    row = rows_of(records)[fp.COSERVED]
    assert row["alpha_m"] == efficiency.ALPHA_FLOOR


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"settled": False}, "the batch's admission had not settled when the window opened"),
        ({"ratio": 0.8 * STEADY}, "batch prefill per generated token"),
        ({"overruns": 0.2}, "could not pace 20.0 %"),
        ({"completions_per_s": 60.0}, "the backlog of 5000 items ran out"),
    ],
)
def test_an_invalid_point_lists_why(changes, reason):
    records = [record(point(fp.ONLINE_ALONE)), record(point(fp.COSERVED), **changes)]
    row = rows_of(records)[fp.COSERVED]
    assert not row["valid"]
    assert any(reason in r for r in row["reasons"]), row["reasons"]


def test_a_point_whose_online_alone_window_is_invalid_is_invalid_too():
    records = [record(point(fp.ONLINE_ALONE), overruns=0.3), record(point(fp.COSERVED))]
    rows = rows_of(records)
    assert rows[fp.ONLINE_ALONE]["reasons"] == ["the twin could not pace 30.0 % of the window's steps (limit 5 %)"]
    assert "its block's online-alone window is invalid" in rows[fp.COSERVED]["reasons"]


def test_a_point_run_on_another_machine_than_its_online_alone_window_is_invalid():
    alone, co = record(point(fp.ONLINE_ALONE)), record(point(fp.COSERVED))
    assert rows_of([alone, co])[fp.COSERVED]["valid"]  # neither recorded its machine (points before 2026-12-05)
    alone["machine"] = co["machine"] = "vm x86_64 AMD EPYC, 2 cores, Python 3.11.7"
    assert rows_of([alone, co])[fp.COSERVED]["valid"]
    alone["machine"] = "vm x86_64 Intel(R) Xeon(R) CPU, 2 cores, Python 3.11.7"
    row = rows_of([alone, co])[fp.COSERVED]
    assert not row["valid"]
    assert row["reasons"] == [
        "ran on vm x86_64 AMD EPYC, 2 cores, Python 3.11.7, its block's online-alone window on "
        "vm x86_64 Intel(R) Xeon(R) CPU, 2 cores, Python 3.11.7"
    ]


def test_a_point_without_its_online_alone_window_has_no_e():
    row = fr.Report(PLAN, [record(point(fp.COSERVED))]).rows()[0]
    assert not row["valid"] and "E" not in row
    assert row["reasons"][-1].startswith("no online-alone window in its block yet")


def test_three_valid_repetitions_give_aggregates_and_the_table_lists_every_point():
    records = [record(point(fp.CEILING), tokens_per_s=1700.0)]
    for rep in range(3):
        records += [record(point(fp.ONLINE_ALONE, rep)), record(point(fp.COSERVED, rep), tokens_per_s=390.0 + 10 * rep)]
    report = fr.Report(PLAN, records)
    results = report.results()
    (aggregate,) = results["aggregates"]
    assert aggregate["harvest"]["value"] == pytest.approx(400.0)
    assert aggregate["harvest"]["reps"] == 3
    assert results["invalid"] == []
    text = fr.table(results)
    assert text.count("| flat-8 | standard | outside | 8 |") == 4  # each repetition, then their means
    assert "| flat-8 | standard | outside | 8 | 3 | 400 [" in text
    assert "- ceiling, standard: 1700" in text
    assert "staged" not in text


def test_the_aggregates_set_each_technique_beside_vllm_alone_at_its_own_alpha_m_with_t_intervals():
    plan = dataclasses.replace(
        PLAN, techniques=("outside", "vllm-priority"), knobs={"outside": (8,), "vllm-priority": (2, 4)}
    )
    peer = {2: (1.2, 100.0), 4: (1.4, 300.0)}  # each setting's inflation and harvest
    records = []
    for rep in range(3):
        records += [record(point(fp.ONLINE_ALONE, rep)), record(point(fp.COSERVED, rep), tokens_per_s=390.0 + 10 * rep)]
        for knob, (slow, tokens) in peer.items():
            at = dataclasses.replace(point(fp.COSERVED, rep), technique="vllm-priority", knob=knob)
            records.append(record(at, tokens_per_s=tokens, slow=slow))
    results = fr.Report(plan, records).results()
    by = {(a["technique"], a["knob"]): a for a in results["aggregates"]}
    ours = by[("outside", 8)]
    assert ours["alpha_m"]["value"] == pytest.approx(1.3)
    assert ours["peer_harvest"] == pytest.approx(200.0)  # halfway along the peer's curve from 1.2 to 1.4
    assert ours["over_peer"]["value"] == pytest.approx(400.0 / 200.0)
    low, high = ours["harvest"]["t_low"], ours["harvest"]["t_high"]
    assert ours["over_peer"]["low"] == pytest.approx(low / 200.0)  # alpha_m did not vary: the harvest's bounds
    assert ours["over_peer"]["high"] == pytest.approx(high / 200.0)
    assert ours["harvest"]["t_low"] < ours["harvest"]["low"] and ours["harvest"]["t_high"] > ours["harvest"]["high"]
    assert by[("vllm-priority", 2)]["peer_harvest"] is None  # the peer is not judged against itself
    text = fr.table(results)
    assert (
        "| flat-8 | standard | outside | 8 | 3 | 400 [" in text
        and f"| 200 | 2.00× [{low / 200:.2f}, {high / 200:.2f}] |" in text
    )


def test_the_table_says_which_arms_staged_their_prompts_and_a_given_gate_reference():
    plan = dataclasses.replace(PLAN, techniques=("outside", "inside"), stage_tokens=128)
    text = fr.table(fr.Report(plan, [record(point(fp.CEILING), tokens_per_s=1700.0)]).results())
    assert text.startswith("outside: batch prompts staged 128 tokens a request.")
    floored = dataclasses.replace(plan, stage_min_tokens=256)
    text = fr.table(fr.Report(floored, [record(point(fp.CEILING), tokens_per_s=1700.0)]).results())
    assert text.startswith("outside: batch prompts staged 128 tokens a request (256 tokens or fewer: whole).")
    given = dataclasses.replace(plan, techniques=("outside-latency",), gate_reference_ms=31.8)
    text = fr.table(fr.Report(given, [record(point(fp.CEILING), tokens_per_s=1700.0)]).results())
    assert text.startswith("outside-latency: the reference inter-token latency given, 31.8 ms.\n\noutside-latency: ")
    profiled = dataclasses.replace(plan, techniques=("outside-latency",), gate_profile=True)
    text = fr.table(fr.Report(profiled, [record(point(fp.CEILING), tokens_per_s=1700.0)]).results())
    assert text.startswith("outside-latency: the reference from the twin's profile at the online load served.\n\n")


def test_the_report_reads_a_plan_back_from_its_json():
    again = fp.FrontierPlan(**PLAN.as_dict())
    assert again.points() == PLAN.points()
    assert dataclasses.asdict(again)["loads"] == ["flat-8"]  # lists, as JSON gives them back


def test_report_only_rebuilds_the_report_from_the_run_directory(tmp_path):
    run = fp.RunDir(tmp_path)
    run.open(PLAN)
    for p in (point(fp.CEILING), point(fp.ONLINE_ALONE), point(fp.COSERVED)):
        run.write(p, record(p, tokens_per_s=1700.0 if p.kind == fp.CEILING else 400.0))
    result = CliRunner().invoke(bench, ["frontier", "--report-only", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output + result.stderr
    assert "| flat-8 | standard | outside | 8 | 400 [400, 400] |" in (tmp_path / "frontier.md").read_text()
    assert (tmp_path / "frontier.png").stat().st_size > 0
    results = json.loads((tmp_path / "frontier.json").read_text())
    assert results["profile_hash"] and results["failed"] == [] and len(results["rows"]) == 3


def test_a_run_directory_refuses_a_command_with_another_plan(tmp_path):
    fp.RunDir(tmp_path).open(PLAN)
    result = CliRunner().invoke(bench, ["frontier", "--quick", "--out", str(tmp_path)])
    assert result.exit_code != 0
    assert "holds a run with another plan" in result.stderr
