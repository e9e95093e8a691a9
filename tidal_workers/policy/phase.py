"""A-P, freeze / thaw: whether a batch item runs as a prefill phase now and a decode phase later.

A split item's prefill runs while the engine has prefill slack; its KV is frozen through the engine's KV
connector, and its decode runs later, thawing that KV, when the engine has decode slack or the batch's laxity
runs out. The FLOPs are the same; only their placement in time moves, and the bill moves to storage
(:func:`storage_usd`). The per-batch option (``tidal.phase_split`` on ``POST /v1/batches``) is one of
``SPLIT_MODES``; ``auto`` asks :func:`split_item`.
"""

from __future__ import annotations

import dataclasses
import enum

AUTO, ALWAYS, NEVER = "auto", "always", "never"
SPLIT_MODES = (AUTO, ALWAYS, NEVER)
GIB_HOUR = 1024**3 * 3600.0  # byte-seconds in a GiB-hour


class Phase(str, enum.Enum):
    WHOLE = "whole"  # prefill and decode in one request, as without A-P
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
    # Urgency at which the decode phase is claimed whatever the decode load (laxity requires it).
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
    """The phases of split items a node may claim now. Whole items are the gate's business, not this one's."""
    phases: list[Phase] = []
    if prefill_slack:
        phases.append(Phase.PREFILL)
    if decode_slack or urgency >= cfg.decode_urgency:
        phases.append(Phase.DECODE)
    return tuple(phases)


def storage_usd(byte_seconds: float, usd_per_gib_hour: float) -> float:
    """What holding frozen KV cost: stored bytes integrated over time, at a price per GiB-hour."""
    return byte_seconds / GIB_HOUR * usd_per_gib_hour
