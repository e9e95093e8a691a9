"""The tiny model: built once, cached, and whole when two processes build it at once."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from config import load_settings
from tidal_api.cli import main
from tidal_engine.tiny import build_tiny


def test_tiny_model_is_cached(tiny_model):
    stamp = tiny_model / "tidal-tiny.json"
    before = stamp.stat().st_mtime_ns
    result = CliRunner().invoke(main, ["engine", "build-tiny"])
    assert result.exit_code == 0 and result.output.strip() == str(tiny_model)
    assert build_tiny(load_settings().home) == tiny_model and stamp.stat().st_mtime_ns == before
    config = json.loads((tiny_model / "config.json").read_text())
    tokenizer = json.loads((tiny_model / "tokenizer.json").read_text())
    assert config["vocab_size"] == len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]) == 259


def test_two_processes_building_one_model_at_once_both_get_it_whole(tmp_path, children):
    """tests/run.sh runs its soaks beside the main pass: two first users of a model build it once, not over each other."""
    script = "import sys; from tidal_engine.tiny import build_tiny; print(build_tiny(sys.argv[1], 'twin'))"
    builders = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    children.extend(builders)
    outputs = [p.communicate(timeout=300)[0].strip() for p in builders]
    assert [p.returncode for p in builders] == [0, 0]
    target = tmp_path / "models" / "twin"
    assert outputs == [str(target)] * 2
    assert json.loads((target / "tidal-tiny.json").read_text())["shape"] == "twin"
    assert not (tmp_path / "models" / "twin.partial").exists()
