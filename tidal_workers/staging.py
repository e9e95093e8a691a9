"""Staged prefill, sent: warm an item's prompt in the engine's prefix cache a chunk per request before the item.

The plan and the bodies are ``policy/staging.py``'s; this sends them on the worker's pooled client with the
item's own ``priority`` and ``cache_salt`` (the salt is what lets the item hit the warmed blocks). Staging only
spreads work the item would do anyway, so it never decides an item's fate: any failure (the engine refuses
``/tokenize``, a warm-up fails or times out) ends the staging and the item is sent as it is, where a real fault
is met and judged as ever (``execute._post``).
"""

from __future__ import annotations

import logging
import typing as t

import prometheus_client
import requests

from tidal_workers.own_requests import OWN
from tidal_workers.policy.staging import stage_prefixes
from tidal_workers.policy.staging import tokenize_request
from tidal_workers.policy.staging import warm_request
from tidal_workers.runtime import Runtime

log = logging.getLogger(__name__)

WARMUPS = prometheus_client.Counter(
    "tidal_prefill_stages", "Staged-prefill warm-ups sent before batch requests, by how they ended.", ["outcome"]
)
WARMUP_TOKENS = prometheus_client.Counter(
    "tidal_prefill_stage_tokens",
    "Prompt tokens of the staged-prefill warm-ups the engine answered (each one also generated one token).",
)


def warm_prompt(rt: Runtime, url: str, body: t.Mapping[str, t.Any], fields: t.Mapping[str, t.Any]) -> int:
    """Warm the prompt of an item's ``body`` (sent to ``url``) in chunks of ``TIDAL_PREFILL_STAGE_TOKENS`` where it
    is longer than ``TIDAL_PREFILL_STAGE_MIN_TOKENS``; ``fields`` are the engine fields every request of the item
    carries (priority, cache_salt). Returns the prompt tokens warmed (0 when the item is not staged or the first
    warm-up failed)."""
    s = rt.settings
    tokenize = tokenize_request(url, body) if s.prefill_stage_tokens > 0 else None
    if tokenize is None:
        return 0
    base = s.vllm_url.rstrip("/")
    try:
        resp = rt.http.post(base + "/tokenize", json=tokenize, timeout=s.request_timeout_seconds)
        answer = resp.json() if resp.status_code == 200 else None
    except (requests.RequestException, ValueError) as exc:
        log.info("staged prefill: /tokenize failed (%s); the item goes whole", exc)
        return 0
    ids = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(ids, list):
        log.info("staged prefill: /tokenize answered %s; the item goes whole", resp.status_code)
        return 0
    warmed = 0
    for length in stage_prefixes(len(ids), s.prefill_stage_tokens, s.prefill_stage_min_tokens):
        OWN.sent()
        try:
            resp = rt.http.post(
                base + "/v1/completions",
                json={**warm_request(body.get("model"), ids[:length]), **fields},
                timeout=s.request_timeout_seconds,
            )
            failure = None if resp.status_code == 200 else f"answered {resp.status_code}"
        except requests.RequestException as exc:
            failure = f"failed ({exc})"
        if failure is not None:
            WARMUPS.labels("failed").inc()
            log.info("staged prefill: a warm-up %s; the item goes on from %d tokens", failure, warmed)
            return warmed
        WARMUPS.labels("sent").inc()
        WARMUP_TOKENS.inc(length)
        OWN.warm_up(length, length - warmed)
        warmed = length
    return warmed
