"""`tidal bench queue`: claim throughput from the sorted sets (one tenant, two taking turns), and re-score cost
against batch size.

Runs against a scratch Redis DB, which it flushes before and after.
"""

from __future__ import annotations

import statistics
import time

import redis

from tidal_workers.bench.stack import BENCH_REDIS_DB
from tidal_workers.queue import WHOLE
from tidal_workers.queue import Queue

SCRATCH_DB = BENCH_REDIS_DB  # the benchmarks' DB: tests hold 1-13 and keep their locks in 15
PER_CALL = (1, 16, 64, 256)  # items per claim call
BATCH_SIZES = (100, 1_000, 10_000, 100_000)  # queued items in the batch re-scored
TENANTS = (1, 2)  # tenants whose batches take turns
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
            ((b * per_batch + i, i, WHOLE) for i in range(per_batch)),
            model=MODEL,
            tenant=f"t{b % tenants}",
        )
    claimed = 0
    start = time.perf_counter()
    while got := q.claim("bench-node", per_call, 600, [MODEL]):
        claimed += len(got)
    elapsed = time.perf_counter() - start
    if claimed != per_batch * batches:
        raise RuntimeError(f"claimed {claimed} of {per_batch * batches} queued items")
    return claimed / elapsed


def rescore_seconds(q: Queue, size: int, repeats: int = 200) -> float:
    """Median seconds of one re-score of a batch holding ``size`` queued items (beside 9 others)."""
    q.redis.flushdb()
    for b in range(10):
        n = size if b == 0 else 1000
        q.enqueue_batch(
            f"batch_{b}", 100, 1e9 + b, ((b * 10_000_000 + i, i, WHOLE) for i in range(n)), model=MODEL, tenant="t"
        )
    times = []
    for k in range(repeats):
        start = time.perf_counter()
        q.rescore("batch_0", 100 - k % 99, 1e9)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(redis_url: str, items: int = 200_000) -> dict:
    """Claims per second by items per call, and re-score median latency by batch size."""
    client = _scratch(redis_url)
    q = Queue(client)
    try:
        claims = {
            # one round trip per item: a tenth of the items says enough
            f"{per_call} per call, {tenants} tenant(s)": claim_throughput(
                q, items if per_call > 1 else items // 10, per_call, tenants
            )
            for tenants in TENANTS
            for per_call in PER_CALL
        }
        rescores = {str(size): rescore_seconds(q, size) * 1e6 for size in BATCH_SIZES}
    finally:
        client.flushdb()
    return {
        "params": {"items": items, "scratch_db": SCRATCH_DB},
        "redis": str(client.info("server").get("redis_version")),
        "claim_items_per_s": claims,
        "rescore_median_us": rescores,
    }
