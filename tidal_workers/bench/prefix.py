"""What prefix-ordered claiming buys: vLLM's prefix-cache hit rate in Tidal's claim order against file order.

One batch of ``items`` completions in ``groups`` groups, each group sharing a
long prompt prefix (the tiny model's tokenizer is byte-level: one token per
character, so a 400-character prefix is 400 tokens, many KV blocks). The input
file lists the requests shuffled; Tidal's ingest sorts them by prompt prefix
(``ingest.claim_key``), so its ordinals claim a group's requests together. Both
orders are sent to the same engine with the same number in flight (as the
claim loop keeps ``target`` in flight), and each run's hit rate is the delta of
``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total``.
Every run gets prefixes of its own (a salt at the start), so no run hits on
blocks another one left in the cache. The effect needs a working set larger
than the KV pool: when every group's prefix fits, any order hits after each
group's first request.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import random
import time

import requests

from tidal_workers.bench import engine_stats
from tidal_workers.ingest import claim_key
from tidal_workers.validate import ParsedLine
from tidal_workers.validate import parse_line

ENDPOINT = "/v1/completions"


@dataclasses.dataclass(frozen=True)
class PrefixConfig:
    engine_url: str
    model: str = "tiny"
    items: int = 96
    groups: int = 12
    prefix_chars: int = 400  # tokens, with the tiny model's byte-level tokenizer
    suffix_chars: int = 24
    max_tokens: int = 4
    inflight: int = 4
    seed: int = 0


def batch_lines(cfg: PrefixConfig, salt: str) -> list[str]:
    """The batch's input file: ``items`` requests over ``groups`` shared prefixes, in shuffled order."""
    rng = random.Random(f"{cfg.seed}-{salt}")
    prefixes = [
        f"{salt} group {g}: " + "".join(rng.choice("abcdefghij klmnop") for _ in range(cfg.prefix_chars))
        for g in range(cfg.groups)
    ]
    lines = []
    for i in range(cfg.items):
        suffix = "".join(rng.choice("qrstuvwxyz") for _ in range(cfg.suffix_chars))
        body = {
            "model": cfg.model,
            "prompt": prefixes[i % cfg.groups][: cfg.prefix_chars] + f" item {i} {suffix}",
            "max_tokens": cfg.max_tokens,
            "temperature": 0,
        }
        lines.append(json.dumps({"custom_id": f"{salt}-{i}", "method": "POST", "url": ENDPOINT, "body": body}))
    rng.shuffle(lines)
    return lines


def parsed(lines: list[str]) -> list[ParsedLine]:
    out = [parse_line(n, text, ENDPOINT) for n, text in enumerate(lines, 1)]
    ok = [p for p in out if isinstance(p, ParsedLine)]
    assert len(ok) == len(out), out
    return ok


def send_all(cfg: PrefixConfig, order: list[ParsedLine]) -> dict:
    """Send ``order`` with at most ``inflight`` outstanding, in order; the engine's prefix-cache deltas."""

    def post(p: ParsedLine) -> int:
        body = {**json.loads(p.body), "priority": 100}
        return requests.post(cfg.engine_url + p.url, json=body, timeout=300).status_code

    engine_stats.wait_idle(cfg.engine_url)
    before = engine_stats.read(cfg.engine_url)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(cfg.inflight) as pool:  # FIFO: submitted in `order`
        statuses = list(pool.map(post, order))
    seconds = time.monotonic() - started
    after = engine_stats.read(cfg.engine_url)
    queries = after.prefix_queries - before.prefix_queries
    hits = after.prefix_hits - before.prefix_hits
    return {
        "requests": len(order),
        "errors": sum(s != 200 for s in statuses),
        "seconds": round(seconds, 2),
        "prefix_queries": queries,
        "prefix_hits": hits,
        "hit_rate": round(hits / queries, 4) if queries else None,
    }


def run(cfg: PrefixConfig) -> dict:
    """(a) Tidal's claim order (ingest's prefix sort) and (b) the file's shuffled order, on fresh prefixes each."""
    claim_order = sorted(parsed(batch_lines(cfg, "a")), key=claim_key)
    shuffled = parsed(batch_lines(cfg, "b"))
    return {
        "params": dataclasses.asdict(cfg),
        "claim_order": send_all(cfg, claim_order),
        "shuffled": send_all(cfg, shuffled),
    }
