"""Scripted engine steps for driving a real vLLM scheduler in-process."""

from __future__ import annotations

import zlib

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

BLOCK_SIZE = 16
SAMPLED_TOKEN = 65  # "A" in the tiny byte vocabulary

_hasher = get_request_block_hasher(BLOCK_SIZE, sha256)


def make_request(request_id: str, prompt: list[int] | int, priority: int, max_tokens: int = 8) -> Request:
    """A request as the engine core builds it; ``prompt`` is token ids or a length."""
    tokens = (
        prompt if isinstance(prompt, list) else [(zlib.crc32(request_id.encode()) + i) % 250 for i in range(prompt)]
    )
    return Request(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        priority=priority,
        block_hasher=_hasher,
    )


def run_step(scheduler: Scheduler) -> SchedulerOutput:
    """One engine step with the model runner scripted: a token for every request past its prompt."""
    output = scheduler.schedule()
    ids = list(output.num_scheduled_tokens)
    sampled = [
        [SAMPLED_TOKEN] if scheduler.requests[i].num_computed_tokens >= scheduler.requests[i].num_tokens else []
        for i in ids
    ]
    runner_output = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={i: n for n, i in enumerate(ids)}, sampled_token_ids=sampled
    )
    scheduler.update_from_output(output, runner_output)
    return output
