"""The twin's step-time function T(P, C), its profiles, and the per-step pacing target (pure)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tidal_engine.step_time import Pacer
from tidal_engine.step_time import Profile
from tidal_engine.step_time import decode_seconds
from tidal_engine.step_time import prefill_seconds
from tidal_engine.step_time import sequence_pairs
from tidal_engine.step_time import smooth_max
from tidal_engine.step_time import step_seconds
from tidal_engine.tiny import kv_bytes_per_token
from tidal_engine.twin import load_profile
from tidal_engine.twin import profile_names
from tidal_engine.twin import profile_tables

A6000 = "qwen2.5-7b@a6000"


def hard_knee(name: str) -> Profile:
    """The profile with the roofline's hard max(): tokens under the knee free."""
    return dataclasses.replace(load_profile(name), knee_sharpness=math.inf)


def test_the_profiles_are_tabulated_and_every_pair_loads():
    assert {A6000, "llama-3.1-8b@h100", "qwen2.5-7b@h200", "qwen2.5-7b@h200-measured"} <= set(profile_names())
    tables = profile_tables()
    for model in tables["models"]:
        for gpu in tables["gpus"]:
            assert load_profile(f"{model}@{gpu}").max_num_batched_tokens == 2048  # τ as on the seed's GPU


def test_unknown_profiles_and_keys_are_refused():
    with pytest.raises(ValueError, match="MODEL@GPU"):
        load_profile("qwen2.5-7b@tpu")
    tables = profile_tables()
    with pytest.raises(ValueError, match="unknown keys"):
        Profile.from_tables("x", {**tables["models"]["qwen2.5-7b"], "typo": 1}, tables["gpus"]["a6000"])


def test_model_shapes_give_the_known_kv_bytes_per_token():
    assert load_profile(A6000).kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344
    assert load_profile("llama-3.1-8b@h100").kv_bytes_per_token == 131_072


def test_a_small_decode_step_streams_the_weights_once():
    p = hard_knee(A6000)
    weights = (7.61e9 - 152_064 * 3_584) * 2  # all but the input embedding, bf16
    floor = 0.003 + weights / (768e9 * 0.85)
    kv = 57_344 * (512 + 1) / (768e9 * 0.85)
    attention = 4 * 28 * 28 * 128 * 513 / (154.8e12 * 0.6)
    assert decode_seconds(p, 1, 512) == pytest.approx(floor + kv + attention, rel=1e-12)
    assert 0.024 < floor < 0.025  # about 40 tokens/s for one stream on an A6000


def test_a_full_prefill_chunk_is_compute_bound():
    p = hard_knee(A6000)
    linear = 2 * 6.53e9 * 2048 / (154.8e12 * 0.6)
    assert linear > p.weight_bytes / p.bandwidth
    expected = 0.003 + linear + 57_344 * 2048 / p.bandwidth + 4 * 28 * 28 * 128 * (2048 * 2049 // 2) / p.flops
    assert prefill_seconds(p, 2048) == pytest.approx(expected, rel=1e-12)
    assert 0.25 < prefill_seconds(p, 2048) < 0.35  # about 0.15 ms per prompt token


def test_the_hard_knee_limit_gives_the_hard_rooflines_table():
    # docs/engine.md's grid before the knee was calibrated (ms): decode(n=64, c=1024), prefill(P=2048, C=0).
    assert decode_seconds(hard_knee(A6000), 64, 1024) * 1e3 == pytest.approx(30.7, abs=0.05)
    assert prefill_seconds(hard_knee(A6000), 2048) * 1e3 == pytest.approx(300.2, abs=0.05)
    assert decode_seconds(hard_knee("llama-3.1-8b@h100"), 256, 512) * 1e3 == pytest.approx(15.6, abs=0.05)
    assert decode_seconds(hard_knee("qwen2.5-7b@h200"), 16, 1024) * 1e3 == pytest.approx(6.9, abs=0.05)


def test_the_smooth_maximum_bends_at_the_knee_and_meets_max_away_from_it():
    assert smooth_max(3.0, 3.0, 2.0) == pytest.approx(3.0 * math.sqrt(2))
    assert smooth_max(1.0, 0.0, 2.2) == 1.0 and smooth_max(0.0, 0.0, 2.2) == 0.0
    assert smooth_max(1.0, 20.0, 2.2) == pytest.approx(20.0, rel=2e-3)
    assert smooth_max(3.0, 2.0, math.inf) == 3.0 and smooth_max(3.0, 3.0, math.inf) == 3.0


@pytest.mark.parametrize("name", [A6000, "llama-3.1-8b@h100", "qwen2.5-7b@h200"])
def test_tokens_under_the_knee_cost_time_and_the_knee_is_in_the_profiles_own_units(name):
    p, hard = load_profile(name), hard_knee(name)
    weights = p.weight_bytes / p.bandwidth
    at_knee = round(p.knee_tokens)
    assert 2 * p.non_embedding_params * p.knee_tokens / p.flops == pytest.approx(weights)
    # At the knee the linear layers take 2^(1/s) of the weight read; a hard knee takes the weight read alone.
    extra = step_seconds(p, at_knee, 0, 0) - step_seconds(hard, at_knee, 0, 0)
    assert extra == pytest.approx(weights * (2 ** (1 / p.knee_sharpness) - 1), rel=0.01)
    # 64 prefill tokens beside 32 decodes: free under a hard knee, not under the calibrated one.
    pairs = 32 * 1025 + sequence_pairs(64, 0)
    decodes_alone = decode_seconds(p, 32, 1024)
    assert step_seconds(hard, 96, 32 * 1024, pairs) - decode_seconds(hard, 32, 1024) < 0.01 * decodes_alone
    assert step_seconds(p, 96, 32 * 1024, pairs) - decodes_alone > 0.02 * decodes_alone


def test_every_profile_has_the_knee_fitted_on_the_h200():
    measured = load_profile("qwen2.5-7b@h200-measured").knee_sharpness
    assert {load_profile(name).knee_sharpness for name in profile_names()} == {measured}


@pytest.mark.parametrize("name", [A6000, "llama-3.1-8b@h100", "qwen2.5-7b@h200"])
def test_step_time_grows_with_tokens_and_context(name):
    p = load_profile(name)
    times = [step_seconds(p, n, c, n * c) for n, c in [(1, 0), (64, 0), (512, 0), (2048, 0)]]
    assert times == sorted(times) and times[0] > p.step_overhead_s
    assert decode_seconds(p, 64, 4096) > decode_seconds(p, 64, 512)
    assert step_seconds(p, 0, 1000, 0) == 0.0  # an empty step computes nothing


def test_faster_gpus_step_faster():
    qwen_a6000, qwen_h200 = load_profile(A6000), load_profile("qwen2.5-7b@h200")
    for n in (1, 256, 2048):
        assert step_seconds(qwen_h200, n, 0, n) < step_seconds(qwen_a6000, n, 0, n)


def test_kv_pool_is_whole_blocks_and_costs_the_twin_little_memory():
    for name in profile_names():
        p = load_profile(name)
        assert p.kv_pool_tokens % 16 == 0
        assert p.kv_pool_tokens * p.kv_bytes_per_token < p.memory_gib * (1 << 30) * p.memory_utilization
        assert p.kv_pool_tokens * kv_bytes_per_token("twin") < 1 << 30
    # A6000: 0.9 x 48 GiB - 15.2 GB of weights - 2 GiB of activations, at 56 KiB per token: about 506 k tokens.
    assert 500_000 < load_profile(A6000).kv_pool_tokens < 510_000


def test_sequence_pairs():
    assert sequence_pairs(1, 500) == 501  # a decode token sees its context and itself
    assert sequence_pairs(4, 0) == 10  # causal: 1 + 2 + 3 + 4
    assert sequence_pairs(2, 3) == 2 * 3 + 3


def test_pacer_sleeps_the_rest_of_the_step_after_the_time_outside_forward():
    pacer = Pacer(window=5)
    assert pacer.sleep_seconds(0.030, 0.004) == pytest.approx(0.026)  # nothing known outside forward yet
    pacer.observe_gap(0.003)
    assert pacer.sleep_seconds(0.030, 0.004) == pytest.approx(0.023)
    # Working gaps of 3 ms alternating with short waits for the next request (an idle client round trip):
    for gap in (0.040, 0.003, 0.050, 0.003):
        pacer.observe_gap(gap)
    assert pacer.outside_s == pytest.approx(0.003)  # the lower quartile stays on the working gaps
    pacer.observe_gap(5.0)  # the engine idled between requests: not step work, left out
    for gap in (0.004, 0.005, 0.006, 0.007, 0.008):  # the window of 5 forgets the older gaps
        pacer.observe_gap(gap)
    assert pacer.outside_s == pytest.approx(0.005)
    assert (pacer.steps, pacer.overruns) == (2, 0)


def test_pacer_counts_steps_it_cannot_slow_down_to():
    pacer = Pacer()
    pacer.observe_gap(0.006)
    assert pacer.sleep_seconds(0.008, 0.003) == 0.0  # 3 ms forward + 6 ms outside > an 8 ms target
    assert pacer.sleep_seconds(0.020, 0.003) == pytest.approx(0.011)
    assert (pacer.steps, pacer.overruns) == (2, 1)


def test_tidal_engine_twin_refuses_an_unknown_profile_before_starting_anything():
    from click.testing import CliRunner

    from tidal_api.cli.engine import twin

    result = CliRunner().invoke(twin, ["--profile", "qwen2.5-7b@a100"])
    assert result.exit_code == 2 and "MODEL@GPU" in result.output


def test_a_time_scaled_profile_takes_k_times_every_step_and_keeps_its_knee_and_pool():
    base = load_profile("qwen2.5-7b@a6000")
    slow = load_profile("qwen2.5-7b@a6000*2.5")
    assert slow.name == "qwen2.5-7b@a6000*2.5"
    for tokens, context in ((1, 0), (40, 24_000), (700, 3_000), (2048, 90_000)):
        pairs = sequence_pairs(tokens, context)
        assert step_seconds(slow, tokens, context, pairs) == pytest.approx(
            2.5 * step_seconds(base, tokens, context, pairs)
        )
    assert slow.knee_tokens == pytest.approx(base.knee_tokens)
    assert slow.kv_pool_tokens == base.kv_pool_tokens
    for bad in ("qwen2.5-7b@a6000*0", "qwen2.5-7b@a6000*x"):
        with pytest.raises(ValueError, match="time scale"):
            load_profile(bad)
