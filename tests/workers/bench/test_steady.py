"""Steady windows (tidal_workers/bench/steady.py; pure): when a window may open and what makes it valid."""

from __future__ import annotations

import pytest

from tidal_workers.bench import steady
from tidal_workers.bench.steady import Sample

pytestmark = pytest.mark.no_sql

STEADY = 2.0  # the mix's prefill per generated token


def series(
    levels: list[float], *, per_s: float = 1.0, ratio: float = STEADY, tokens_per_s: float = 500.0, start: float = 0.0
) -> list[Sample]:
    """One sample a second: batch requests at the engine as given, ``per_s`` completions and ``tokens_per_s``
    generated tokens a second, prefilled at ``ratio`` per generated token."""
    return [
        Sample(start + i, level, per_s * i, ratio * tokens_per_s * i, tokens_per_s * i)
        for i, level in enumerate(levels)
    ]


def test_admission_waits_for_the_level_to_hold_and_for_a_turnover():
    ramp = [0.0, 20.0, 40.0, 60.0, 80.0]  # the gate filling
    held = series(ramp + [100.0] * 60, per_s=2.0)
    early = steady.admission(held[:25], hold_s=10)
    assert early.level == pytest.approx(100.0)
    assert early.since == 5.0  # the first sample at the level
    assert early.turnover == 38.0
    assert not early.settled  # 19 s at the level, but 38 completions: fewer than the 100 requests it holds
    late = steady.admission(held, hold_s=10)
    assert late.settled and late.turnover == 118.0


def test_admission_is_not_settled_while_the_level_moves_or_is_zero():
    assert not steady.admission(series([float(i) for i in range(60)], per_s=5.0), hold_s=10).settled
    assert not steady.admission(series([0.0] * 60, per_s=5.0), hold_s=10).settled
    assert not steady.admission([], hold_s=10).settled


def test_a_small_level_may_move_by_one_request():
    wobble = [4.0, 3.0] * 30  # one lane between its completion and its next request
    assert steady.admission(series(wobble, per_s=1.0), hold_s=10).settled


def test_a_sawtooth_steady_on_average_settles():
    """A gate's AIMD saws around its mean: every sample is off the level, every block's mean is on it."""
    saw = [30.0 + 2.0 * (i % 20) for i in range(120)]  # 30 to 68 and back to 30, a 20-s period
    verdict = steady.admission(series(saw, per_s=2.0), hold_s=40)
    assert verdict.settled
    assert verdict.level == pytest.approx(49.0)
    assert verdict.since == pytest.approx(20.0)  # the first of the whole 20-s blocks back from the last sample


def test_a_steady_window_is_valid():
    verdict = steady.judge(series([100.0] * 121, per_s=2.0), STEADY, overrun_share=0.01)
    assert verdict.valid, verdict.reasons
    assert verdict.completions == 240
    assert verdict.prefill_per_generated == pytest.approx(STEADY)
    assert verdict.drift == pytest.approx(0.0)


def test_a_draining_window_is_invalid_for_its_drift():
    draining = series([185.0 - i for i in range(121)], per_s=3.0)
    verdict = steady.judge(draining, STEADY, overrun_share=0.0)
    assert not verdict.valid
    assert verdict.drift == pytest.approx(60 / 125, rel=0.02)
    assert any("drift" in r for r in verdict.reasons)


def test_a_diurnal_window_has_no_drift_rule():
    swinging = series([50.0 + i for i in range(121)], per_s=3.0)
    assert steady.judge(swinging, STEADY, overrun_share=0.0, drift_rule=False).valid
    assert not steady.judge(swinging, STEADY, overrun_share=0.0).valid


def test_items_prefilled_before_the_window_show_in_its_ratio():
    transient = series([100.0] * 121, per_s=3.0, ratio=1.0)  # the audit's 0.5-1.2 against 2.04
    verdict = steady.judge(transient, STEADY, overrun_share=0.0)
    assert not verdict.valid
    assert verdict.reasons == ("batch prefill per generated token 1.000, not within 10 % of the mix's steady 2.000",)


def test_few_completions_pass_only_when_the_ratio_interval_holds_the_steady_value():
    noisy = []
    prefill = generated = 0.0
    for i in range(61):  # blocks alternate 1.9 and 2.1 prefill per generated token: the interval spans 2.0
        ratio = 1.9 if (i // 10) % 2 == 0 else 2.1
        noisy.append(Sample(float(i), 20.0, i * 0.5, prefill, generated))
        prefill, generated = prefill + ratio * 100, generated + 100
    verdict = steady.judge(noisy, STEADY, overrun_share=None)
    assert verdict.completions == 30
    assert verdict.ratio_interval is not None and verdict.ratio_interval[0] <= STEADY <= verdict.ratio_interval[1]
    assert verdict.valid, verdict.reasons
    # a few dozen completions: a point estimate 15 % off is no reason while the interval holds the steady value
    swinging, prefill, generated = [], 0.0, 0.0
    for i in range(61):
        ratio = 1.5 if (i // 10) % 2 == 0 else 3.1
        swinging.append(Sample(float(i), 20.0, i * 0.5, prefill, generated))
        prefill, generated = prefill + ratio * 100, generated + 100
    wide = steady.judge(swinging, STEADY, overrun_share=None)
    assert wide.prefill_per_generated is not None and wide.prefill_per_generated / STEADY > 1.1
    assert wide.valid, wide.reasons
    off = steady.judge(series([20.0] * 61, per_s=0.5, ratio=2.1), STEADY, overrun_share=None)
    assert not off.valid  # 2.1 is within 10 %, but 30 completions and an interval [2.1, 2.1] without 2.0
    assert off.reasons[0].startswith("30 batch completions (fewer than 200)")


def test_overruns_over_five_percent_invalidate_the_window():
    verdict = steady.judge(series([100.0] * 121, per_s=2.0), STEADY, overrun_share=0.08)
    assert not verdict.valid
    assert verdict.reasons == ("the twin could not pace 8.0 % of the window's steps (limit 5 %)",)


def test_a_window_without_samples_is_invalid():
    assert steady.judge([], STEADY, overrun_share=None).reasons == ("fewer than two samples in the window",)


def test_blocks_and_within_cut_the_series():
    samples = series([1.0] * 25)
    assert [s.at for s in steady.within(samples, 5, 7)] == [5.0, 6.0, 7.0]
    cut = steady.blocks(samples, block_s=10)
    assert list(cut.seconds) == [10.0, 10.0, 4.0]  # t 0-10, 10-20, 20-24
    assert list(cut.generated) == [5000.0, 5000.0, 2000.0]
    assert list(cut.prefill) == [10000.0, 10000.0, 4000.0]
    low, high = steady.ratio_interval(cut.generated, cut.seconds) or (0, 0)
    assert low == high == 500.0  # a steady rate: every resample of the blocks gives it


def test_a_small_level_may_drift_by_under_one_request():
    """Two or three requests at the engine: halves of 2.0 and 2.3 are 14 % apart, and steady all the same (at α_set
    1.05 the relative budget's five to seven drifted 0.7 of a request, 11 %)."""
    small = series([2.0] * 60 + [2.0, 3.0, 2.0] * 20 + [2.0], per_s=2.0)  # means 2.0 and 2.33
    assert steady.judge(small, STEADY, overrun_share=0.0).valid
    moving = series([2.0] * 60 + [3.5] * 61, per_s=2.0)  # a request and a half more in the second half
    assert not steady.judge(moving, STEADY, overrun_share=0.0).valid
