"""`tidal bench disagg`'s figures: per arm a mean with its interval, and the within-block ratio."""

from __future__ import annotations

import pytest

from tidal_workers.bench.disagg import summarize

pytestmark = pytest.mark.no_sql


def arm(mode: str, tokens: float, ttft: float) -> dict:
    online = {"ttft_p50": ttft, "ttft_p99": 2 * ttft, "tbt_p99": 0.1}
    return {"mode": mode, "batch_tokens_per_s": tokens, "online": online, "engine_cpu_cores": 1.7}


def test_three_blocks_give_intervals_and_the_ratio_within_each_block():
    # ABBA as run() orders them: D U, U D, D U.
    arms = [arm("disagg", 30, 1.0), arm("unified", 40, 0.5), arm("unified", 50, 0.5)]
    arms += [arm("disagg", 25, 1.0), arm("disagg", 20, 1.0), arm("unified", 40, 0.25)]
    s = summarize(arms)
    assert s["disagg"]["batch_tokens_per_s"]["value"] == pytest.approx(25.0)
    assert s["unified"]["batch_tokens_per_s"]["reps"] == 3
    assert s["unified"]["batch_tokens_per_s"]["low"] <= 43.33 <= s["unified"]["batch_tokens_per_s"]["high"]
    # Block by block: 30/40, 25/50, 20/40; TTFT 1/0.5, 1/0.5, 1/0.25.
    assert s["disagg_over_unified"]["batch_tokens_per_s"]["value"] == pytest.approx((0.75 + 0.5 + 0.5) / 3)
    assert s["disagg_over_unified"]["online_ttft_p50_s"]["value"] == pytest.approx((2 + 2 + 4) / 3)
    assert s["disagg_over_unified"]["engine_cpu_cores"]["low"] == s["disagg_over_unified"]["engine_cpu_cores"]["high"]


def test_two_blocks_give_the_mean_and_no_interval():
    s = summarize([arm("disagg", 30, 1.0), arm("unified", 40, 0.5), arm("unified", 50, 0.5), arm("disagg", 25, 1.0)])
    assert s["disagg"]["batch_tokens_per_s"] == {"value": 27.5, "low": None, "high": None, "reps": 2}
