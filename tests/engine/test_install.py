"""`tidal engine install-cpu`: the CPU build of vLLM with the post-install fixes (docs/engine.md)."""

from __future__ import annotations

from importlib import metadata

from click.testing import CliRunner

from tidal_api.cli import main
from tidal_engine.install import UNWANTED
from tidal_engine.install import installed


def test_install_cpu_is_idempotent():
    first = CliRunner().invoke(main, ["engine", "install-cpu"])
    again = CliRunner().invoke(main, ["engine", "install-cpu"])
    assert first.exit_code == again.exit_code == 0
    assert again.output.strip() == "CPU engine already fixed"
    assert not any(installed(name) for name in UNWANTED)
    assert metadata.version("vllm").endswith("+cpu")  # what the `vllm` command looks up
