"""The frontier's plan (tidal_workers/bench/frontier_plan.py): its points, their ABBA order, and resuming a run."""

from __future__ import annotations

import json
import lzma

import pytest

from tests.support.bench_helpers import frontier_plan
from tidal_workers.bench import frontier_plan as fp

pytestmark = pytest.mark.no_sql


def label(p: fp.Point) -> str:
    return p.kind if p.technique is None else f"{p.technique} {p.knob:g}"


def test_quick_measures_the_ceiling_then_alternates_the_arms_around_online_alone():
    points = frontier_plan().points()
    assert [label(p) for p in points] == [
        "ceiling",
        "outside 8",
        "inside 1.1",
        "vllm-priority 4",
        "vllm-priority 16",
        "online-alone",
        "inside 1.5",
        "outside 32",
        "outside 185",  # the gate's ceiling is outside's last setting
        "inside 4",
        "vllm-priority 64",
    ]
    assert len({p.name for p in points}) == len(points)
    assert points[1].name == "coserved__flat-8__standard__outside-8__r0"
    assert points[0].name == "ceiling__standard__r0"


def test_every_other_block_runs_in_reverse_and_the_ceiling_is_measured_once_per_mix():
    points = frontier_plan(loads=("flat-8", "flat-5"), reps=2).points()
    assert sum(p.kind == fp.CEILING for p in points) == 1
    blocks = [
        [p for p in points if p.kind != fp.CEILING and (p.load, p.rep) == key]
        for key in [("flat-8", 0), ("flat-5", 0), ("flat-8", 1), ("flat-5", 1)]
    ]
    assert [label(p) for p in blocks[1]] == [label(p) for p in reversed(blocks[0])]
    assert [label(p) for p in blocks[2]] == [label(p) for p in blocks[0]]
    assert all(sum(p.kind == fp.ONLINE_ALONE for p in b) == 1 for b in blocks)


def test_knob_settings_above_the_gate_ceiling_are_dropped():
    assert frontier_plan(gate_ceiling=20).knob_values("outside") == (8, 20)


def test_staged_prefill_is_an_arm_of_its_own_on_the_gate_s_ceilings_when_asked_for():
    techniques = ("outside", "outside-staged")
    plan = frontier_plan(gate_ceiling=20, techniques=techniques, knobs={t: fp.QUICK_KNOBS[t] for t in techniques})
    staged = [p for p in plan.points() if p.technique == "outside-staged"]
    assert [p.knob for p in staged] == [8, 20] == [p.knob for p in plan.points() if p.technique == "outside"]
    assert staged[0].name == "coserved__flat-8__standard__outside-staged-8__r0"
    assert not [p for p in frontier_plan().points() if p.technique == "outside-staged"]
    assert "outside-staged" in fp.KNOB_NAMES


def test_stage_tokens_stage_the_stock_engine_gates_only():
    plan = frontier_plan(stage_tokens=64)
    assert [plan.stage_tokens_for(t) for t in fp.TECHNIQUES] == [64, 0, 0, 64, fp.STAGE_TOKENS]
    assert [frontier_plan().stage_tokens_for(t) for t in fp.TECHNIQUES] == [0, 0, 0, 0, fp.STAGE_TOKENS]


@pytest.mark.parametrize(("field", "other"), [("stage_tokens", 128), ("gate_profile", True), ("stage_min_tokens", 256)])
def test_a_plan_written_before_a_field_resumes_with_its_default(tmp_path, field, other):
    """stage_tokens (unstaged), gate_profile (the reference given or fitted) and stage_min_tokens (every prompt
    longer than a chunk staged) came after the first runs."""
    plan = frontier_plan()
    fields = plan.as_dict()
    del fields[field]
    (tmp_path / "plan.json").write_text(json.dumps(fields))
    run = fp.RunDir(tmp_path)
    run.open(plan)  # the same plan: no mismatch
    assert getattr(run.plan(), field) == getattr(plan, field)
    with pytest.raises(fp.PlanMismatch, match=field):
        run.open(frontier_plan(**{field: other}))


def test_the_estimate_counts_each_point_kind():
    quick = frontier_plan()
    seconds = quick.expected_s(quick.points(), {"flat-8": "flat"})
    assert 40 * 60 < seconds < 60 * 60  # quick is sized to fit an hour


def test_a_run_resumes_with_its_plan_and_refuses_another(tmp_path):
    run = fp.RunDir(tmp_path / "run")
    run.open(frontier_plan())
    point = frontier_plan().points()[1]
    assert not run.done(point)
    (run.points_dir / f"{point.name}.json.tmp").write_text("{")  # a write cut short: not a point
    assert not run.done(point)
    run.write(point, {"harvest": 1.0})
    again = fp.RunDir(tmp_path / "run")
    again.open(frontier_plan())
    assert again.done(point)
    assert again.records() == [{"point": point.as_dict(), "harvest": 1.0}]
    with pytest.raises(fp.PlanMismatch, match="window_s differ"):
        again.open(frontier_plan(window_s=60.0))


def test_a_plan_written_before_a_field_was_added_resumes_at_that_field_s_default(tmp_path):
    run = fp.RunDir(tmp_path / "run")
    run.open(frontier_plan())
    older = json.loads((run.root / "plan.json").read_text())
    del older["time_scale"]
    (run.root / "plan.json").write_text(json.dumps(older))
    run.open(frontier_plan())  # no mismatch: time_scale 1 is what the older plan ran
    with pytest.raises(fp.PlanMismatch, match="time_scale differ"):
        run.open(frontier_plan(time_scale=2.0))


def test_a_failed_point_is_kept_apart_and_measured_again(tmp_path):
    run = fp.RunDir(tmp_path / "run")
    run.open(frontier_plan())
    point = frontier_plan().points()[2]
    try:
        raise TimeoutError("the engine never ran 256 requests at once")
    except TimeoutError as exc:
        run.fail(point, exc)
    assert not run.done(point)  # the next run measures it again
    (failure,) = run.failures()
    assert failure["point"] == point.as_dict() and "never ran 256 requests" in failure["error"]
    run.write(point, {})
    assert run.failures() == []


def test_the_latency_gate_is_an_arm_of_its_own_when_asked_for():
    """``--techniques ...,outside-latency``: the latency gate's α_set swept beside the others, ABBA like them; the
    default plan does not hold it, so a run started before the arm existed still resumes."""
    techniques = (*fp.DEFAULT_TECHNIQUES, "outside-latency")
    plan = frontier_plan(techniques=techniques, knobs={tech: fp.QUICK_KNOBS[tech] for tech in techniques})
    latency = [p.knob for p in plan.points() if p.technique == "outside-latency"]
    assert latency == [1.1, 1.5]
    assert not [p for p in frontier_plan().points() if p.technique == "outside-latency"]
    assert "outside-latency" in fp.KNOB_NAMES


def test_a_run_committed_with_its_points_packed_is_read_and_resumed_as_it_is(tmp_path):
    run = fp.RunDir(tmp_path / "run")
    run.open(frontier_plan())
    point = frontier_plan().points()[1]
    path = run.write(point, {"harvest": 1.0})
    path.with_name(path.name + ".xz").write_bytes(lzma.compress(path.read_bytes()))
    path.unlink()
    assert run.done(point)
    assert run.records() == [{"point": point.as_dict(), "harvest": 1.0}]
