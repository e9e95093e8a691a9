"""The GPU-timed twin: real ``vllm serve`` on a tiny model whose steps take a named GPU's time.

``register`` is the ``vllm.general_plugins`` entry point (setup.cfg): every vLLM process calls it, and it
names the twin's architecture so that a config.json saying ``TidalTwinForCausalLM`` selects
``twin_model.TidalTwinForCausalLM`` (imported lazily, no fork or patch of vLLM). The profiles are data in
``twin_profiles.toml``; ``step_time`` turns one into T(P, C).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tidal_engine.step_time import TIME_SCALE_MARK
from tidal_engine.step_time import Profile

ARCHITECTURE = "TidalTwinForCausalLM"
PROFILES_PATH = Path(__file__).with_name("twin_profiles.toml")
DEFAULT_PROFILE = "qwen2.5-7b@a6000"


def register() -> None:
    """vLLM general plugin hook: registers the twin's architecture by name (lazy import)."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, "tidal_engine.twin_model:TidalTwinForCausalLM")


def profile_tables() -> dict:
    with PROFILES_PATH.open("rb") as f:
        return tomllib.load(f)


def profile_names() -> list[str]:
    """The tabulated profiles (docs/engine.md); any MODEL@GPU pair of the file also loads."""
    return list(profile_tables()["profiles"])


def load_profile(name: str) -> Profile:
    """The profile MODEL@GPU from ``twin_profiles.toml``, or MODEL@GPU*K: that profile with every step K times as
    long (Profile.time_scaled); ValueError naming the choices if there is none."""
    base, mark, scale = name.partition(TIME_SCALE_MARK)
    if mark:
        try:
            k = float(scale)
        except ValueError:
            k = 0.0
        if not k > 0:
            raise ValueError(f"twin profile {name!r}: the time scale after {TIME_SCALE_MARK!r} must be a number > 0")
        return load_profile(base).time_scaled(k)
    tables = profile_tables()
    model, _, gpu = name.partition("@")
    if model not in tables["models"] or gpu not in tables["gpus"]:
        raise ValueError(
            f"unknown twin profile {name!r}: MODEL@GPU with MODEL one of {', '.join(tables['models'])} "
            f"and GPU one of {', '.join(tables['gpus'])}"
        )
    return Profile.from_tables(name, tables["models"][model], tables["gpus"][gpu])
