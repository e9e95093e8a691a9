"""The twin harvest's default worker cap is the gate ceiling a deployment in front of that GPU would get."""

from __future__ import annotations

from tidal_workers.bench.cli.common import deployment_ceiling


def test_the_cap_is_the_smaller_of_slots_and_kv_requests_less_the_headroom():
    # A6000: 256 slots, a 506,032-token pool = 247 requests of 2,048 tokens; 0.75 of the smaller.
    assert deployment_ceiling("qwen2.5-7b@a6000", 0) == int(247 * 0.75) == 185
    # Fewer slots than the pool holds requests: the slots bound it.
    assert deployment_ceiling("qwen2.5-7b@a6000", 100) == 75
