"""Fixtures for the engine area: the tiny model (built once, cached) and the real
vLLM scheduler built in-process from that model's VllmConfig. No server runs here:
the tests on real vLLM servers are tests/e2e's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm.config import CacheConfig
from vllm.config import ModelConfig
from vllm.config import SchedulerConfig
from vllm.config import VllmConfig
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.kv_cache_interface import KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from config import load_settings
from tests.support.engine_steps import BLOCK_SIZE
from tidal_engine.tiny import build_tiny


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny model under the stable TIDAL_HOME (tests/run.sh keeps it between runs)."""
    return build_tiny(load_settings().home)


@pytest.fixture(scope="session")
def vllm_config_factory(tiny_model):
    init_none_hash(sha256)

    def make(max_num_seqs: int = 16, max_num_batched_tokens: int = 2048) -> VllmConfig:
        return VllmConfig(
            model_config=ModelConfig(model=str(tiny_model), dtype="float32", max_model_len=4096, seed=0),
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=4096,
                policy="priority",
                enable_chunked_prefill=True,
                is_encoder_decoder=False,
            ),
            cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
        )

    return make


@pytest.fixture
def make_scheduler(vllm_config_factory):
    """Build a real vLLM scheduler (a Tidal one or the stock one, sync or async) the way the engine core does."""

    def make(
        cls: type[Scheduler], num_blocks: int = 1001, settings=None, async_scheduling: bool = False, **config
    ) -> Scheduler:
        vllm_config = vllm_config_factory(**config)
        vllm_config.cache_config.num_gpu_blocks = num_blocks
        # The CPU platform turned async scheduling off while the config was built; a GPU build leaves it on.
        vllm_config.scheduler_config.async_scheduling = async_scheduling
        # The tiny model's attention: 2 KV heads of size 32.
        spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=32, dtype=torch.float32)
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
        )
        kwargs = {"settings": settings} if settings is not None else {}
        return cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK_SIZE,
            log_stats=True,
            **kwargs,
        )

    return make
