"""The engine preflight: does this node's engine take batch requests as Tidal sends them?

Every batch request carries vLLM's ``priority`` (100…1), so that online traffic at priority 0 goes first: the
engine must run ``--scheduling-policy priority``. An engine that refuses the field answers every batch request
400 naming it, which would turn a whole batch into error lines within a second. So before the node claims, at
start and whenever its engine comes back, the worker probes it (``EngineHealth``): ``/health`` answers 200, it
lists a model, and a one-token completion of that model at ``PRIORITY_MAX`` is not refused for its priority.

vLLM 0.32 itself does not refuse: started with ``--scheduling-policy fcfs`` it answers a request carrying
``priority`` 200 and ignores the field (checked on the CPU build), and nothing it serves outside its development
endpoints names its policy; such an engine passes. ``tidal engine serve`` and compose always start vLLM with the
priority policy, and TidalScheduler refuses to start without it.
"""

from __future__ import annotations

import requests

from config import Settings
from tidal_workers.health import Check
from tidal_workers.health import engine_answers
from tidal_workers.policy.laxity import PRIORITY_MAX

#: The probe's prompt: the stub engine of the tests tells the probe from batch requests by it.
PROBE_PROMPT = "tidal preflight"
#: A freshly started engine answers one token at once; a busy one serves priority 0 first.
PROBE_TIMEOUT_SECONDS = 60.0
#: The verdict on an engine that refuses ``priority``, whether the probe or a batch request met the refusal: the
#: same words, so the node logs it once however often it is met.
REFUSED = "the engine refuses the priority Tidal sends (HTTP 400): start vLLM with --scheduling-policy priority"


def refuses_priority(status: int | None, body: str | None) -> bool:
    """Whether an engine's answer refuses the request for its ``priority`` (a 400 that names it)."""
    return status == 400 and "priority" in (body or "")[:2000].lower()


def probe(settings: Settings, models: tuple[str, ...]) -> Check:
    """One preflight of the engine at ``settings.vllm_url``, which lists ``models``: ok, or why not."""
    health = engine_answers(settings)
    if not health.ok:
        return health
    base = settings.vllm_url.rstrip("/")
    if not models:
        return Check("preflight", False, f"{base}/v1/models lists no model")
    body = {"model": models[0], "prompt": PROBE_PROMPT, "max_tokens": 1, "priority": PRIORITY_MAX}
    try:
        answer = requests.post(base + "/v1/completions", json=body, timeout=PROBE_TIMEOUT_SECONDS)
    except requests.RequestException as exc:
        return Check("preflight", False, f"{base}/v1/completions unreachable: {type(exc).__name__}")
    if refuses_priority(answer.status_code, answer.text):
        return refusal()
    return Check("preflight", True)


def refusal() -> Check:
    """The failed preflight of an engine that refuses ``priority``."""
    return Check("preflight", False, REFUSED)
