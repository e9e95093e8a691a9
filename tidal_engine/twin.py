"""The GPU-timed twin: a tiny model whose steps take a named GPU's time (issue 16; being built)."""

from __future__ import annotations


def register() -> None:
    """vLLM general plugin hook: registers the twin's architecture by name (lazy import)."""
    from vllm import ModelRegistry

    ModelRegistry.register_model("TidalTwinForCausalLM", "tidal_engine.twin_model:TidalTwinForCausalLM")
