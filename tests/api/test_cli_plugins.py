"""The `tidal` command takes extra commands from the ``tidal.commands`` entry point group (`tidal bench` among them),
and the product runs without the benchmarks: `tidal`, `tidal up` and the API start with tidal_workers.bench absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from tests.support.worker_helpers import ROOT
from tests.support.worker_helpers import settings_env
from tidal_api.cli import PLUGIN_GROUP

WITHOUT_BENCHMARKS = """
import json, sys
sys.modules["tidal_workers.bench"] = None  # as if the benchmark package were not installed: importing it fails
from click.testing import CliRunner
from tidal_api import create_app
from tidal_api.cli import main

up = CliRunner().invoke(main, ["up", "--help"])
listed = CliRunner().invoke(main, ["--help"])
with create_app().test_client() as client:  # a full start: migrations, keys, the storage sentinel
    health = client.get("/health").status_code
    files = client.get("/v1/files", headers={"Authorization": "Bearer acme-key"}).status_code
print(json.dumps({
    "up": [up.exit_code, up.output], "listed": [listed.exit_code, listed.output], "health": health, "files": files,
    "bench_loaded": sorted(m for m in sys.modules if m.startswith("tidal_workers.bench.")),
}))
"""

PLUGIN = '''
import sys

import click

print("probe plugin imported", file=sys.stderr)

@click.command()
def hello() -> None:
    """Say hello from a plugin."""
    click.echo("hello from a plugin")

not_a_command = object()
'''

ENTRY_POINTS = f"""[{PLUGIN_GROUP}]
hello = tidal_probe_plugin:hello
broken = tidal_probe_missing:command
odd = tidal_probe_plugin:not_a_command
up = tidal_probe_plugin:hello
"""


def test_tidal_up_and_the_api_start_without_the_benchmarks(settings):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_BENCHMARKS],
        capture_output=True,
        text=True,
        timeout=120,
        env=settings_env(settings),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["up"][0] == 0 and "Run the whole Tidal stack" in seen["up"][1]
    assert seen["listed"][0] == 0 and "  up " in seen["listed"][1] and "  bench " not in seen["listed"][1]
    assert (seen["health"], seen["files"]) == (200, 200)
    assert seen["bench_loaded"] == []
    # Where `tidal bench` is registered (an installed checkout), its absence costs one log line, no traceback.
    registered = any(point.name == "bench" for point in entry_points(group=PLUGIN_GROUP))
    said = "\n".join([done.stderr, seen["up"][1], seen["listed"][1]])  # the runner holds what the commands logged
    left_out = [line for line in said.splitlines() if "'bench'" in line and "left out" in line]
    assert len(left_out) == (1 if registered else 0), said
    assert "Traceback" not in said


def test_plugin_commands_load_and_a_broken_one_is_left_out_with_one_log_line(tmp_path: Path):
    (tmp_path / "tidal_probe_plugin.py").write_text(PLUGIN)
    info = tmp_path / "tidal_probe_plugin-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tidal-probe-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}  # the probe plugin after the checkout

    def tidal(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tidal_api.cli", *args], capture_output=True, text=True, timeout=60, env=env
        )

    listed = tidal("--help")
    assert listed.returncode == 0, listed.stderr
    assert "  hello  " in listed.stdout and "Say hello from a plugin." in listed.stdout
    assert "broken" not in listed.stdout and "odd" not in listed.stdout
    assert "Run the whole Tidal stack" in listed.stdout  # a plugin never replaces a built-in command
    for name, why in (("broken", "ModuleNotFoundError"), ("odd", "not a new click command"), ("up", "not a new")):
        lines = [line for line in listed.stderr.splitlines() if f"{name!r}" in line]
        assert len(lines) == 1 and "left out" in lines[0] and why in lines[0], listed.stderr
    built_in = tidal("up", "--help")  # a built-in command imports no plugin, and so meets no broken one
    assert built_in.returncode == 0 and built_in.stderr == "", built_in.stderr
    said = tidal("hello")
    assert said.returncode == 0 and said.stdout == "hello from a plugin\n", said.stderr
