"""A-P's split decision and phase claiming (tidal_workers.policy.phase): pure, on scripted inputs."""

from __future__ import annotations

import pytest

from tidal_workers.policy.phase import ALWAYS
from tidal_workers.policy.phase import AUTO
from tidal_workers.policy.phase import NEVER
from tidal_workers.policy.phase import Phase
from tidal_workers.policy.phase import SplitConfig
from tidal_workers.policy.phase import claimable_phases
from tidal_workers.policy.phase import has_prefill_slack
from tidal_workers.policy.phase import phase_request
from tidal_workers.policy.phase import split_item
from tidal_workers.policy.phase import storage_usd

CFG = SplitConfig(min_prompt_tokens=512, max_prompt_tokens=2048, min_laxity_seconds=3600.0)
HOURS = 3600.0


@pytest.mark.parametrize(
    "mode, tokens, laxity, split",
    [
        (AUTO, 1500, 10 * HOURS, True),  # long prompt, a window with room: freeze it
        (AUTO, 1500, 0.5 * HOURS, False),  # no laxity left to wait for decode slack
        (AUTO, 200, 10 * HOURS, False),  # too short to be worth the storage
        (AUTO, 2049, 10 * HOURS, False),  # over τ: the connector cannot freeze it faithfully
        (ALWAYS, 200, 0.0, True),  # asked for, and it can be frozen
        (ALWAYS, 4000, 10 * HOURS, False),  # asked for, but over τ: runs whole rather than thaw wrong
        (NEVER, 1500, 10 * HOURS, False),
        (ALWAYS, 0, 10 * HOURS, False),  # nothing to prefill
    ],
)
def test_split_item(mode, tokens, laxity, split):
    assert split_item(mode, tokens, laxity, CFG) is split


def test_auto_stops_splitting_as_laxity_runs_out():
    laxities = [10 * HOURS, 4 * HOURS, 1 * HOURS, 0.9 * HOURS, 0.0, -HOURS]
    assert [split_item(AUTO, 1500, lax, CFG) for lax in laxities] == [True, True, True, False, False, False]


def test_prefill_slack_is_a_share_of_tau():
    assert has_prefill_slack(100, 2048, CFG)
    assert not has_prefill_slack(512, 2048, CFG)  # exactly a quarter of τ is not slack


@pytest.mark.parametrize(
    "prefill, decode, urgency, phases",
    [
        (True, False, 0.0, (Phase.PREFILL,)),
        (False, True, 0.0, (Phase.DECODE,)),
        (True, True, 0.0, (Phase.PREFILL, Phase.DECODE)),
        (False, False, 0.0, ()),
        (False, False, 0.5, (Phase.PREFILL, Phase.DECODE)),  # laxity requires both now, slack or not
        (False, True, 0.49, (Phase.DECODE,)),
    ],
)
def test_claimable_phases(prefill, decode, urgency, phases):
    assert claimable_phases(prefill, decode, urgency, CFG) == phases


def test_storage_is_billed_per_gib_hour():
    assert storage_usd(1024**3 * 3600, 0.01) == pytest.approx(0.01)
    assert storage_usd(12 * 1024 * 2000 * 6 * 3600, 0.01) == pytest.approx(0.01 * 12 * 1024 * 2000 * 6 / 1024**3)


def test_phase_requests():
    """Whole: the item's body as it is. Split: tagged with the batch; the prefill asks one token, nothing else of
    the body's output bounds, so it cannot conflict with them (min_tokens over max_tokens is an engine error)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 64, "min_tokens": 8}
    tag = {"kv_transfer_params": {"tidal_freeze": "batch_1"}}
    assert phase_request(body, Phase.WHOLE, "batch_1") == body
    assert phase_request(body, Phase.DECODE, "batch_1") == {**body, **tag}
    assert phase_request(body, Phase.PREFILL, "batch_1") == {
        "model": "m",
        "messages": body["messages"],
        "max_tokens": 1,
        **tag,
    }
