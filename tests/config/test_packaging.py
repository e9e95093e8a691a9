"""Every package the project installs is pinned to one version (issue 37 L10): a release of a dependency can
change nothing here until setup.cfg names it."""

from __future__ import annotations

import configparser
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


def requirements() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(SETUP_CFG)
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in cfg["options.extras_require"].values():
        lines += [r for r in extra.splitlines() if not r.strip().startswith("tidal[")]  # tidal[...]: the other extras
    return [r.strip() for r in lines if r.strip()]


def test_every_requirement_is_pinned_to_one_version() -> None:
    reqs = requirements()
    assert len(reqs) > 20, reqs  # install_requires and every extra were read
    unpinned = [r for r in reqs if "==" not in r or any(op in r for op in (">", "<", "~", "!", ","))]
    assert unpinned == []
