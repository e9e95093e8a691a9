"""The phase split (freeze / thaw): whether a batch item runs as a prefill phase now and a decode phase later.

A split item's prefill runs while the engine has prefill slack; its KV is frozen through the engine's KV
connector, and its decode runs later, thawing that KV, when the engine has decode slack or the batch's laxity
runs out. The FLOPs are the same; only their placement in time moves, and the bill moves to storage
(:func:`storage_usd`). The per-batch option (``tidal.phase_split`` on ``POST /v1/batches``) is one of
``SPLIT_MODES``; ``auto`` asks :func:`split_item`.
"""

from __future__ import annotations

import dataclasses
import enum
import typing as t

from tidal_workers.policy.body import OUTPUT_LIMIT_FIELDS

AUTO, ALWAYS, NEVER = "auto", "always", "never"
SPLIT_MODES = (AUTO, ALWAYS, NEVER)
GIB_HOUR = 1024**3 * 3600.0  # byte-seconds in a GiB-hour
# The key of kv_transfer_params that TidalFreezeConnector reads (tidal_engine.freeze.TAG: the engine plugin
# imports nothing of the workers, so the name is written in both, and a test holds them equal).
FREEZE_TAG = "tidal_freeze"


class Phase(str, enum.Enum):
    WHOLE = "whole"  # prefill and decode in one request, as without the phase split
    PREFILL = "prefill"  # compute and freeze the prompt's KV (max_tokens 1)
    DECODE = "decode"  # thaw the KV and generate; recomputes the prompt if the KV is gone


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    # Below this a recompute costs little more than reading the KV back: not worth the storage.
    min_prompt_tokens: int = 512
    # The freezing engine's τ: the example connector stores one prefill chunk only (docs/engine.md), so a
    # longer prompt would thaw wrong; it runs whole.
    max_prompt_tokens: int = 2048
    # The decode phase must be able to wait this long for decode slack and still meet the window.
    min_laxity_seconds: float = 3600.0
    # Prefill slack: the engine's prefill tokens per step below this share of τ.
    prefill_slack_frac: float = 0.25
    # Urgency at which a split item's phases are claimed whatever the load (laxity requires it).
    decode_urgency: float = 0.5


def split_item(mode: str, prompt_tokens: int, laxity_seconds: float, cfg: SplitConfig) -> bool:
    """Whether an item is split into a prefill and a decode phase.

    ``always`` still runs whole what cannot be frozen faithfully (over ``max_prompt_tokens``); ``auto``
    splits only prompts long enough to be worth it, and only while the batch has laxity for the wait.
    """
    if mode == NEVER or prompt_tokens > cfg.max_prompt_tokens or prompt_tokens < 1:
        return False
    if mode == ALWAYS:
        return True
    return prompt_tokens >= cfg.min_prompt_tokens and laxity_seconds >= cfg.min_laxity_seconds


def has_prefill_slack(prefill_tokens_per_step: float, tau: int, cfg: SplitConfig) -> bool:
    """Few prefill tokens per step (from /metrics or TidalScheduler): a frozen prefill fits beside them."""
    return prefill_tokens_per_step < cfg.prefill_slack_frac * tau


def claimable_phases(prefill_slack: bool, decode_slack: bool, urgency: float, cfg: SplitConfig) -> tuple[Phase, ...]:
    """The phases of split items a node may claim now. Whole items are the gate's business, not this one's.

    At ``decode_urgency`` both phases run whatever the load: a prefill that waited for slack that never came
    must not cost the batch its window either.
    """
    urgent = urgency >= cfg.decode_urgency
    phases: list[Phase] = []
    if prefill_slack or urgent:
        phases.append(Phase.PREFILL)
    if decode_slack or urgent:
        phases.append(Phase.DECODE)
    return tuple(phases)


def phase_request(body: t.Mapping[str, t.Any], phase: Phase, batch_id: str) -> dict[str, t.Any]:
    """The body a run of ``phase`` posts: the item's own when whole; tagged with its batch for the freeze
    connector when split, the prefill cut to one output token (its KV is what it runs for; its answer is dropped,
    so the output limits and ``min_tokens`` of the item's body go with it)."""
    if phase is Phase.WHOLE:
        return dict(body)
    tagged = {**body, "kv_transfer_params": {FREEZE_TAG: batch_id}}
    if phase is Phase.DECODE:
        return tagged
    cut = {k: v for k, v in tagged.items() if k not in (*OUTPUT_LIMIT_FIELDS, "min_tokens")}
    return {**cut, "max_tokens": 1}


def storage_usd(byte_seconds: float, usd_per_gib_hour: float) -> float:
    """What holding frozen KV cost: stored bytes integrated over time, at a price per GiB-hour."""
    return byte_seconds / GIB_HOUR * usd_per_gib_hour
