"""`tidal bench calibrate --device cpu --tiny`: the calibration script runs end to end and its profile loads."""

from __future__ import annotations

import json
import tomllib

from click.testing import CliRunner

from tidal_engine.step_time import Profile
from tidal_engine.twin import profile_tables
from tidal_workers.bench.calibrate import TINY_GRID
from tidal_workers.bench.cli.engine_runs import calibrate


def test_calibrate_times_every_cell_and_writes_a_loadable_profile(tmp_path):
    result = CliRunner().invoke(calibrate, ["--device", "cpu", "--tiny", "--reps", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "calibrate.json").read_text())
    assert [row["cell"] for row in report["table"]] == [c.label for c in TINY_GRID]
    assert all(len(report["samples_s"][c.label]) == 2 and min(report["samples_s"][c.label]) > 0 for c in TINY_GRID)
    assert report["shape"]["num_layers"] == 2 and report["git_commit"] and report["argv"]
    fit = report["fit"]
    assert 0 < fit["bandwidth_efficiency"] <= 1 and 0 < fit["compute_efficiency"] <= 1
    measured = tomllib.loads((tmp_path / "profile-measured.toml").read_text())["gpus"]["a6000-measured"]
    assert measured["bandwidth_efficiency"] == fit["bandwidth_efficiency"]
    profile = Profile.from_tables("qwen2.5-7b@a6000-measured", profile_tables()["models"]["qwen2.5-7b"], measured)
    assert profile.compute_efficiency == fit["compute_efficiency"]
