"""Tenants' shares of claims under concurrent nodes (``tidal bench fairness``; a measurement, not a test).

Two tenants queue work for one model at one priority on a scratch Redis DB: ``heavy`` as many small batches (100 by
default), ``light`` as one batch. Several nodes, each a thread with its own Redis connection, keep ``inflight`` items
leased as the claim loop does: whenever items settle they claim what they lack in one ``CLAIM``, and each item
settles after a service time drawn from an exponential distribution (a simulated engine: the claim script, not
the engine, decides the shares). A run ends when either tenant has nothing left to claim; its share is counted
over every claim made until then, while both were queued. Each weight pair is run ``reps`` times.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import threading
import time

import redis

from tidal_workers import keys
from tidal_workers.attempt import Attempt
from tidal_workers.bench import stats
from tidal_workers.queue import WHOLE
from tidal_workers.queue import Queue

MODEL = "bench"
TENANTS = ("heavy", "light")


@dataclasses.dataclass(frozen=True)
class FairnessConfig:
    redis_url: str
    weights: tuple[float, float]  # heavy, light
    nodes: int = 4
    inflight: int = 8  # items each node keeps leased
    heavy_batches: int = 100
    items: int = 1500  # per tenant
    service_ms: float = 4.0  # mean simulated engine time per item
    seed: int = 0


def _enqueue(q: Queue, cfg: FairnessConfig) -> None:
    deadline = time.time() + 86_400
    per_batch = cfg.items // cfg.heavy_batches
    for b in range(cfg.heavy_batches):
        first = b * per_batch
        q.enqueue_batch(
            f"heavy-{b:04d}",
            100,
            deadline + b,
            ((first + i, i, WHOLE) for i in range(per_batch)),
            model=MODEL,
            tenant="heavy",
            weight=cfg.weights[0],
        )
    light = ((10_000_000 + i, i, WHOLE) for i in range(cfg.items))
    q.enqueue_batch("light-0", 100, deadline, light, model=MODEL, tenant="light", weight=cfg.weights[1])


def run_once(cfg: FairnessConfig, rep: int) -> dict[str, float | int]:
    """One run: claims per tenant until one of them runs out, and the heavy tenant's share of them."""
    admin = redis.Redis.from_url(cfg.redis_url, decode_responses=True)
    admin.flushdb()
    _enqueue(Queue(admin), cfg)
    claimed = dict.fromkeys(TENANTS, 0)
    lock, done = threading.Lock(), threading.Event()
    totals = {"heavy": cfg.items // cfg.heavy_batches * cfg.heavy_batches, "light": cfg.items}

    def node(k: int) -> None:
        client = redis.Redis.from_url(cfg.redis_url, decode_responses=True)
        q, rng = Queue(client), random.Random(cfg.seed * 1_000 + rep * 100 + k)
        held: list[tuple[float, int, str]] = []  # (settles at, item, lease)
        name = f"bench-node-{k}"
        while not done.is_set():
            now = time.monotonic()
            while held and held[0][0] <= now:
                _, item, lease = heapq.heappop(held)
                q.complete(Attempt(item, lease))
            claims = q.claim(name, cfg.inflight - len(held), 600, [MODEL])
            with lock:
                if not done.is_set():
                    for c in claims:
                        tenant = c.batch_id.split("-", 1)[0]
                        claimed[tenant] += 1
                    if any(claimed[t] >= totals[t] for t in TENANTS):
                        done.set()
            for c in claims:
                heapq.heappush(held, (now + rng.expovariate(1000.0 / cfg.service_ms), c.item_id, c.lease))
            if held:
                time.sleep(max(0.0, held[0][0] - time.monotonic()))
        client.close()

    threads = [threading.Thread(target=node, args=(k,), daemon=True) for k in range(cfg.nodes)]
    started = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - started
    admin.flushdb()
    admin.close()
    total = sum(claimed.values())
    return {
        "heavy": claimed["heavy"],
        "light": claimed["light"],
        "heavy_share": claimed["heavy"] / total,
        "seconds": round(elapsed, 3),
    }


def measure(cfg: FairnessConfig, reps: int) -> dict:
    """``reps`` runs of one weight pair: raw samples and the heavy share against its weight's, as a ratio."""
    runs = [run_once(cfg, rep) for rep in range(reps)]
    expected = cfg.weights[0] / sum(cfg.weights)
    ratios = [float(r["heavy_share"]) / expected for r in runs]
    mean, low, high = stats.t_interval(ratios)
    return {
        "weights": {"heavy": cfg.weights[0], "light": cfg.weights[1]},
        "expected_heavy_share": expected,
        "share_ratio_mean": round(mean, 4),
        "share_ratio_95": [round(low, 4), round(high, 4)],
        "within_10_percent": low >= 0.9 and high <= 1.1,
        "runs": runs,
    }


def config_summary(cfg: FairnessConfig) -> dict:
    return {
        "nodes": cfg.nodes,
        "inflight_per_node": cfg.inflight,
        "heavy_batches": cfg.heavy_batches,
        "light_batches": 1,
        "items_per_tenant": cfg.items,
        "service_ms_mean": cfg.service_ms,
        "redis_db": cfg.redis_url.rsplit("/", 1)[1],
        "layout": keys.LAYOUT,
    }


__all__ = ["FairnessConfig", "config_summary", "measure", "run_once"]
