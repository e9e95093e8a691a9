"""Fixtures for the engine area: the tiny model (built once, cached) and the real
vLLM scheduler built in-process from that model's VllmConfig. No server runs here:
the tests on real vLLM servers are tests/e2e's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm.v1.core.sched.scheduler import Scheduler

from config import load_settings
from tidal_engine.tiny import build_tiny
from tidal_workers.bench.virtual import build_scheduler


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny model under the stable TIDAL_HOME (tests/run.sh keeps it between runs)."""
    return build_tiny(load_settings().home)


@pytest.fixture
def make_scheduler(tiny_model):
    """Build a real vLLM scheduler (a Tidal one or the stock one, sync or async) the way the engine core does."""

    def make(
        cls: type[Scheduler],
        num_blocks: int = 1001,
        settings=None,
        async_scheduling: bool = False,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 2048,
    ) -> Scheduler:
        return build_scheduler(
            cls,
            str(tiny_model),
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            num_blocks=num_blocks,
            settings=settings,
            async_scheduling=async_scheduling,
        )

    return make
