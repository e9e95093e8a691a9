"""Queue benchmark (not a test): claim throughput from the sorted sets (one tenant, two taking turns), and re-score
cost against batch size.

Runs against a scratch Redis DB, which it flushes before and after:
``python -c "from tidal_workers.bench_queue import main; main()"``.
"""

from __future__ import annotations

import statistics
import time

import redis

from config import load_settings
from tidal_workers.queue import Queue

SCRATCH_DB = 15
MODEL = "bench"


def _scratch(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + f"/{SCRATCH_DB}", decode_responses=True)


def claim_throughput(q: Queue, items: int, per_call: int, tenants: int, batches: int = 10) -> float:
    """Items per second one node claims (leases included), ``per_call`` items per Lua call, from batches of
    ``tenants`` tenants at one priority (one: runs of items; two: their turns alternate item by item)."""
    q.redis.flushdb()
    per_batch = items // batches
    for b in range(batches):
        q.enqueue_batch(
            f"batch_{b}",
            100,
            1e9 + b,
            ((b * per_batch + i, i) for i in range(per_batch)),
            model=MODEL,
            tenant=f"t{b % tenants}",
        )
    claimed = 0
    start = time.perf_counter()
    while got := q.claim("bench-node", per_call, 600, [MODEL]):
        claimed += len(got)
    elapsed = time.perf_counter() - start
    assert claimed == per_batch * batches
    return claimed / elapsed


def rescore_seconds(q: Queue, size: int, repeats: int = 200) -> float:
    """Median seconds of one re-score of a batch holding ``size`` queued items (beside 9 others)."""
    q.redis.flushdb()
    for b in range(10):
        n = size if b == 0 else 1000
        q.enqueue_batch(
            f"batch_{b}", 100, 1e9 + b, ((b * 10_000_000 + i, i) for i in range(n)), model=MODEL, tenant="t"
        )
    times = []
    for k in range(repeats):
        start = time.perf_counter()
        q.rescore("batch_0", 100 - k % 99, 1e9)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(items: int = 200_000) -> None:
    client = _scratch(load_settings().redis_url)
    q = Queue(client)
    try:
        for tenants in (1, 2):
            for per_call in (1, 16, 64, 256):
                n = items if per_call > 1 else items // 10  # one round trip per item: a smaller run says enough
                rate = claim_throughput(q, n, per_call, tenants)
                print(f"claim  {per_call:>4} per call, {tenants} tenant(s): {rate:>9,.0f} items/s")
        for size in (100, 1_000, 10_000, 100_000):
            print(f"rescore {size:>7,} queued items: {rescore_seconds(q, size) * 1e6:>6.0f} µs (median)")
    finally:
        client.flushdb()
