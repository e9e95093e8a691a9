"""Benchmark requests: lengths in the served model's tokens, drawn inside their stated ranges, never a shared prefix."""

from __future__ import annotations

import random

import pytest

from config import load_settings
from tidal_engine.tiny import build_tiny
from tidal_workers.bench import workload

pytestmark = pytest.mark.no_sql


@pytest.fixture(scope="module")
def tokenizer():
    return workload.load_tokenizer(str(build_tiny(load_settings().home)))


def test_lengths_stay_in_their_range_around_the_median():
    lengths = workload.GPU_WORKLOAD.online_prompt
    rng = random.Random(3)
    drawn = sorted(lengths.draw(rng) for _ in range(2000))
    assert lengths.low <= drawn[0] and drawn[-1] <= lengths.high
    assert 0.8 * lengths.median <= drawn[len(drawn) // 2] <= 1.2 * lengths.median


def test_prompts_have_the_drawn_token_count_and_are_distinct(tokenizer):
    prompts = workload.Prompts(tokenizer, seed=1)
    made = [prompts.make(n) for n in (32, 256, 1024, 256)]
    assert [len(tokenizer.encode(p, add_special_tokens=False)) for p in made] == [32, 256, 1024, 256]
    heads = {p[:16] for p in made}
    assert len(heads) == len(made)  # not even the first cache block is shared


def test_online_requests_keep_their_arrival_and_output_length(tokenizer):
    rng = random.Random(5)
    requests = workload.online_requests([0.0, 0.5], workload.CPU_WORKLOAD, workload.Prompts(tokenizer, 2), rng)
    assert [r.at for r in requests] == [0.0, 0.5]
    out = workload.CPU_WORKLOAD.online_output
    assert all(out.low <= r.max_tokens <= out.high for r in requests)


@pytest.mark.parametrize(
    ("name", "prompt", "output"), [("standard", 900, 440), ("decode-heavy", 200, 860), ("long-prompt", 2500, 300)]
)
def test_batch_mixes_have_the_mean_lengths_their_source_states(name, prompt, output):
    mix = workload.BATCH_MIXES[name]
    assert f"{prompt:,}" in mix.source and f"{output:,}" in mix.source
    assert mix.prompt.mean() + 19 == pytest.approx(prompt, rel=0.05)  # with the chat template's 19 tokens
    assert mix.output.mean() == pytest.approx(output, rel=0.05)
    assert mix.workload().online_prompt == workload.GPU_WORKLOAD.online_prompt
    assert mix.prompt.high + mix.output.high <= 8192 - 19  # the twin's context
