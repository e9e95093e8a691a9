"""The item queue: two levels of Redis sorted sets, leases with fencing, and the Lua that keeps them atomic.

Batches are ordered by score (priority, then deadline) and items inside a batch
by ordinal (prompt-prefix groups), so escalating a batch re-orders all its
queued items with one ``ZADD XX`` whatever its size. Kombu's own Redis
priorities are ten FIFO lists that cannot re-order a queued message, which is
why only *claimed* items become Celery messages. Key layout: ``keys.py``.
Times inside the scripts come from Redis's clock, so nodes never compare their
own clocks.
"""

from __future__ import annotations

import dataclasses
import typing as t

import redis

from tidal_workers import keys

PRIORITY_SCALE = 10_000_000_000  # score = priority * 1e10 + deadline; exact below 2**53
ENQUEUE_CHUNK = 5000  # items per ENQUEUE call, so one script never blocks Redis for long

# Gauge bands of the queue depth: (label, lowest priority, highest priority).
BANDS = (("0", 0, 0), ("1-9", 1, 9), ("10-49", 10, 49), ("50-99", 50, 99), ("100", 100, 100))

ENQUEUE = """
-- KEYS[1] = tidal:batches  KEYS[2] = tidal:lease  KEYS[3] = tidal:batch:{batch}  KEYS[4] = tidal:b:{batch}:ready
-- ARGV[1] = batch id  ARGV[2] = batch score  ARGV[3] = item key prefix
-- ARGV[4..] = item id, ordinal pairs. Items holding a lease are in flight and skipped.
-- Returns the number of items queued.
redis.call('HSET', KEYS[3], 'score', ARGV[2])
local n = 0
for i = 4, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    redis.call('HSET', ARGV[3] .. ARGV[i], 'batch', ARGV[1], 'ord', ARGV[i + 1])
    redis.call('ZADD', KEYS[4], ARGV[i + 1], ARGV[i])
    n = n + 1
  end
end
if redis.call('ZCARD', KEYS[4]) > 0 then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
end
return n
"""

# Shared by CLAIM and CLAIM_BATCH (the same KEYS[1..5] and ARGV[1..3]): leases popped items under
# one Redis-clock expiry and appends {item id, lease, batch id} to `out`.
_LEASE = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[3])
local stamp = t[1] .. string.format('%06d', tonumber(t[2]))
local out = {}
local function lease(popped, batch, itemprefix)
  for i = 1, #popped, 2 do
    local id = popped[i]
    local attempt = redis.call('HINCRBY', itemprefix .. id, 'attempts', 1)
    local l = ARGV[1] .. '|' .. attempt .. '|' .. stamp
    redis.call('ZADD', KEYS[2], expiry, id)
    redis.call('ZADD', KEYS[3], expiry, id)
    redis.call('HSET', KEYS[4], id, l)
    out[#out + 1] = id
    out[#out + 1] = l
    out[#out + 1] = batch
  end
  if #out > 0 then redis.call('SADD', KEYS[5], ARGV[1]) end
end
"""

CLAIM = (
    """
-- KEYS[1] = tidal:batches  KEYS[2] = tidal:inflight  KEYS[3] = tidal:node:{node}:inflight
-- KEYS[4] = tidal:lease    KEYS[5] = tidal:nodes
-- ARGV[1] = node  ARGV[2] = most items to claim  ARGV[3] = lease seconds
-- ARGV[4] = ready key prefix  ARGV[5] = ready key suffix  ARGV[6] = item key prefix
-- Pops the lowest-ordinal items of the lowest-score batch, moving on while it runs dry,
-- and leases each one. Returns {item id, lease, batch id, ...}.
"""
    + _LEASE
    + """
local want = tonumber(ARGV[2])
while want > 0 do
  local top = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #top == 0 then break end
  local batch = top[1]
  local popped = redis.call('ZPOPMIN', ARGV[4] .. batch .. ARGV[5], want)
  if #popped < 2 * want then
    redis.call('ZREM', KEYS[1], batch)
  end
  lease(popped, batch, ARGV[6])
  want = want - #popped / 2
end
return out
"""
)

CLAIM_BATCH = (
    """
-- KEYS[1] = tidal:batches  KEYS[2] = tidal:inflight  KEYS[3] = tidal:node:{node}:inflight
-- KEYS[4] = tidal:lease    KEYS[5] = tidal:nodes     KEYS[6] = tidal:b:{batch}:ready
-- ARGV[1] = node  ARGV[2] = most items to claim  ARGV[3] = lease seconds
-- ARGV[4] = batch id  ARGV[5] = item key prefix
-- The floor's claim: pops the lowest-ordinal items of one named batch, whatever its score,
-- and leases each one. Returns {item id, lease, batch id, ...}.
"""
    + _LEASE
    + """
local want = tonumber(ARGV[2])
local popped = redis.call('ZPOPMIN', KEYS[6], want)
if #popped < 2 * want then
  redis.call('ZREM', KEYS[1], ARGV[4])
end
lease(popped, ARGV[4], ARGV[5])
return out
"""
)

RENEW = """
-- KEYS[1] = tidal:inflight  KEYS[2] = tidal:node:{node}:inflight  KEYS[3] = tidal:lease
-- ARGV[1] = lease seconds  ARGV[2..] = item id, lease pairs held by this node
-- Extends each lease still held; returns the item ids whose lease is gone.
local t = redis.call('TIME')
local expiry = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[3], ARGV[i]) == ARGV[i + 1] then
    redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
    redis.call('ZADD', KEYS[2], 'XX', expiry, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

COMPLETE = """
-- KEYS[1] = tidal:inflight  KEYS[2] = tidal:node:{node}:inflight  KEYS[3] = tidal:lease
-- KEYS[4] = tidal:item:{item}
-- ARGV[1] = item id  ARGV[2] = lease
-- Forgets the item if ARGV[2] is still its lease; returns 1, or 0 for a stale attempt.
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[4])
return 1
"""

EXPIRE = """
-- KEYS[1] = tidal:inflight  KEYS[2] = tidal:node:{node}:inflight  KEYS[3] = tidal:lease
-- ARGV[1] = item id  ARGV[2] = lease
-- Ends a lease now if ARGV[2] is still current, so the next RECLAIM requeues its item. Returns 1, or 0 if stale.
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
redis.call('ZADD', KEYS[2], 'XX', 0, ARGV[1])
return 1
"""

RECLAIM = """
-- KEYS[1] = tidal:batches  KEYS[2] = tidal:inflight  KEYS[3] = tidal:lease
-- ARGV[1] = most leases to reclaim  ARGV[2] = batch key prefix  ARGV[3] = ready key prefix
-- ARGV[4] = ready key suffix  ARGV[5] = item key prefix  ARGV[6] = node key prefix  ARGV[7] = node key suffix
-- Expired leases go back to their batch's ready set at their ordinal, and the batch back
-- into tidal:batches at its stored score; an item of a dropped batch is abandoned.
-- Returns {item id, batch id or '', 1 = requeued / 0 = abandoned, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(expired) do
  local lease = redis.call('HGET', KEYS[3], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  if lease then
    local node = string.match(lease, '^(.*)|%d+|%d+$')
    if node then redis.call('ZREM', ARGV[6] .. node .. ARGV[7], id) end
  end
  local itemkey = ARGV[5] .. id
  local f = redis.call('HMGET', itemkey, 'batch', 'ord')
  local score = false
  if f[1] then score = redis.call('HGET', ARGV[2] .. f[1], 'score') end
  if score then
    redis.call('ZADD', ARGV[3] .. f[1] .. ARGV[4], f[2], id)
    redis.call('ZADD', KEYS[1], score, f[1])
    out[#out + 1] = id; out[#out + 1] = f[1]; out[#out + 1] = 1
  else
    redis.call('DEL', itemkey)
    out[#out + 1] = id; out[#out + 1] = f[1] or ''; out[#out + 1] = 0
  end
end
return out
"""

RESCORE = """
-- KEYS[1] = tidal:batches  KEYS[2] = tidal:batch:{batch}
-- ARGV[1] = batch id  ARGV[2] = new score
-- One ZADD XX re-orders every queued item of the batch; leased items pick the score
-- up if they are requeued. Returns 0 if the batch is not open in Redis.
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
redis.call('HSET', KEYS[2], 'score', ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
return 1
"""

DROP = """
-- KEYS[1] = tidal:batches  KEYS[2] = tidal:batch:{batch}  KEYS[3] = tidal:b:{batch}:ready
-- ARGV[1] = batch id  ARGV[2] = item key prefix
-- Forgets a batch's queued items at once; its leased items finish or are abandoned.
-- Returns the number of queued items dropped.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
local ids = redis.call('ZRANGE', KEYS[3], 0, -1)
for _, id in ipairs(ids) do
  redis.call('DEL', ARGV[2] .. id)
end
redis.call('DEL', KEYS[3])
return #ids
"""

BATCH_INFLIGHT = """
-- KEYS[1] = tidal:inflight  ARGV[1] = batch id  ARGV[2] = item key prefix
-- Counts the batch's leased items (scans every lease: bounded by the fleet's in-flight total).
local n = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if redis.call('HGET', ARGV[2] .. id, 'batch') == ARGV[1] then n = n + 1 end
end
return n
"""

DEPTH = """
-- KEYS[1] = tidal:batches  ARGV[1] = ready key prefix  ARGV[2] = ready key suffix
-- Returns {batch score, queued items, ...} for every queued batch.
local out = {}
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  out[#out + 1] = all[i + 1]
  out[#out + 1] = redis.call('ZCARD', ARGV[1] .. all[i] .. ARGV[2])
end
return out
"""


def batch_score(priority: int, deadline: float) -> int:
    """Lowest first: priority (vLLM's, lower is sooner), then earliest deadline."""
    return int(priority) * PRIORITY_SCALE + int(deadline)


def score_priority(score: float) -> int:
    return int(float(score)) // PRIORITY_SCALE


def parse_lease(lease: str) -> tuple[str, int]:
    """(node, attempt) of a lease ``node|attempt|claim-µs``."""
    node, attempt, _stamp = lease.rsplit("|", 2)
    return node, int(attempt)


@dataclasses.dataclass(frozen=True)
class Claim:
    item_id: int
    lease: str
    batch_id: str

    @property
    def attempt(self) -> int:
        return parse_lease(self.lease)[1]

    @property
    def task_id(self) -> str:
        """The Celery task id Flower shows for this attempt."""
        return f"item-{self.item_id}#{self.attempt}"


@dataclasses.dataclass(frozen=True)
class Reclaimed:
    item_id: int
    batch_id: str
    requeued: bool  # False: its batch was dropped, so the item was abandoned


class Queue:
    """Tidal's view of its Redis keys; every mutation is one atomic script.

    ``client`` decodes responses (``Runtime.redis``), so its replies are ``str``; the casts below say so to mypy.
    """

    def __init__(self, client: redis.Redis):
        self.redis = client
        self._enqueue = client.register_script(ENQUEUE)
        self._claim = client.register_script(CLAIM)
        self._claim_batch = client.register_script(CLAIM_BATCH)
        self._renew = client.register_script(RENEW)
        self._complete = client.register_script(COMPLETE)
        self._reclaim = client.register_script(RECLAIM)
        self._expire = client.register_script(EXPIRE)
        self._rescore = client.register_script(RESCORE)
        self._drop = client.register_script(DROP)
        self._batch_inflight = client.register_script(BATCH_INFLIGHT)
        self._depth = client.register_script(DEPTH)

    # --- producers -----------------------------------------------------------
    def enqueue_batch(self, batch_id: str, priority: int, deadline: float, items: t.Iterable[tuple[int, int]]) -> int:
        """Queue ``(item_id, ordinal)`` pairs of an open batch; leased items are skipped. Returns how many."""
        score = batch_score(priority, deadline)
        keys_ = [keys.BATCHES, keys.LEASES, keys.batch(batch_id), keys.ready(batch_id)]
        queued, calls = 0, 0
        chunk: list[int] = []
        for item_id, ordinal in items:
            chunk += (item_id, ordinal)
            if len(chunk) >= 2 * ENQUEUE_CHUNK:
                queued += self._enqueue(keys=keys_, args=[batch_id, score, keys.ITEM_PREFIX, *chunk])
                chunk, calls = [], calls + 1
        if chunk or not calls:  # at least once: an open batch keeps its score even with nothing to queue
            queued += self._enqueue(keys=keys_, args=[batch_id, score, keys.ITEM_PREFIX, *chunk])
        return queued

    def rescore(self, batch_id: str, priority: int, deadline: float) -> bool:
        """Re-order all of a batch's queued items with one ZADD XX; False if the batch is not queued."""
        return bool(
            self._rescore(keys=[keys.BATCHES, keys.batch(batch_id)], args=[batch_id, batch_score(priority, deadline)])
        )

    def drop_batch(self, batch_id: str) -> int:
        """Forget a batch's queued items (cancel, expiry, finalize); returns how many were dropped."""
        return int(
            self._drop(
                keys=[keys.BATCHES, keys.batch(batch_id), keys.ready(batch_id)], args=[batch_id, keys.ITEM_PREFIX]
            )
        )

    # --- consumers -------------------------------------------------------------
    def claim(self, node: str, n: int, lease_seconds: float) -> list[Claim]:
        """Atomically lease up to ``n`` items in claim order (priority, deadline, ordinal)."""
        if n <= 0:
            return []
        flat = self._claim(
            keys=[keys.BATCHES, keys.INFLIGHT, keys.node_inflight(node), keys.LEASES, keys.NODES],
            args=[node, n, lease_seconds, keys.READY_PREFIX, keys.READY_SUFFIX, keys.ITEM_PREFIX],
        )
        return [Claim(int(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    def claim_batch(self, node: str, batch_id: str, n: int, lease_seconds: float) -> list[Claim]:
        """Atomically lease up to ``n`` items of one batch in ordinal order, whatever its score (the floor)."""
        if n <= 0:
            return []
        flat = self._claim_batch(
            keys=[keys.BATCHES, keys.INFLIGHT, keys.node_inflight(node), keys.LEASES, keys.NODES, keys.ready(batch_id)],
            args=[node, n, lease_seconds, batch_id, keys.ITEM_PREFIX],
        )
        return [Claim(int(flat[i]), flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    def renew(self, node: str, leases: t.Iterable[tuple[int, str]], lease_seconds: float) -> list[int]:
        """Extend the given leases of ``node``; returns the item ids whose lease was lost."""
        pairs = [x for pair in leases for x in pair]
        if not pairs:
            return []
        lost = self._renew(keys=[keys.INFLIGHT, keys.node_inflight(node), keys.LEASES], args=[lease_seconds, *pairs])
        return [int(i) for i in lost]

    def complete(self, item_id: int, lease: str) -> bool:
        """Forget a settled item if ``lease`` is still its lease; False for a stale attempt."""
        node, _ = parse_lease(lease)
        return bool(
            self._complete(
                keys=[keys.INFLIGHT, keys.node_inflight(node), keys.LEASES, keys.item(item_id)],
                args=[item_id, lease],
            )
        )

    def expire(self, item_id: int, lease: str) -> bool:
        """End ``lease`` now, if still current, for the next reclaim to requeue its item (an engine outage)."""
        node, _ = parse_lease(lease)
        return bool(self._expire(keys=[keys.INFLIGHT, keys.node_inflight(node), keys.LEASES], args=[item_id, lease]))

    def lease_current(self, item_id: int, lease: str) -> bool:
        return self.redis.hget(keys.LEASES, str(item_id)) == lease

    def reclaim_expired(self, limit: int = 1000) -> list[Reclaimed]:
        """Requeue items whose lease expired (their worker died); abandon those of dropped batches."""
        flat = self._reclaim(
            keys=[keys.BATCHES, keys.INFLIGHT, keys.LEASES],
            args=[
                limit,
                keys.BATCH_PREFIX,
                keys.READY_PREFIX,
                keys.READY_SUFFIX,
                keys.ITEM_PREFIX,
                keys.NODE_PREFIX,
                keys.NODE_SUFFIX,
            ],
        )
        return [Reclaimed(int(flat[i]), flat[i + 1], bool(int(flat[i + 2]))) for i in range(0, len(flat), 3)]

    # --- reading -----------------------------------------------------------------
    def inflight(self, node: str) -> int:
        return int(self.redis.zcard(keys.node_inflight(node)))

    def inflight_by_node(self) -> dict[str, int]:
        nodes = sorted(t.cast(set[str], self.redis.smembers(keys.NODES)))
        with self.redis.pipeline(transaction=False) as p:
            for node in nodes:
                p.zcard(keys.node_inflight(node))
            return dict(zip(nodes, (int(n) for n in p.execute())))

    def batch_inflight(self, batch_id: str) -> int:
        return int(self._batch_inflight(keys=[keys.INFLIGHT], args=[batch_id, keys.ITEM_PREFIX]))

    def queued_batches(self) -> list[str]:
        return t.cast(list[str], self.redis.zrange(keys.BATCHES, 0, -1))

    def set_urgent(self, batch_ids: t.Iterable[str]) -> None:
        """Replace the set of batches the floor admits past the gate (one transaction)."""
        with self.redis.pipeline() as p:
            p.delete(keys.URGENT)
            ids = list(batch_ids)
            if ids:
                p.sadd(keys.URGENT, *ids)
            p.execute()

    def urgent(self) -> set[str]:
        return t.cast(set[str], self.redis.smembers(keys.URGENT))

    def depth_by_band(self) -> dict[str, int]:
        """Queued items per priority band (items waiting here are invisible to Flower)."""
        flat = self._depth(keys=[keys.BATCHES], args=[keys.READY_PREFIX, keys.READY_SUFFIX])
        depth = {label: 0 for label, _, _ in BANDS}
        for i in range(0, len(flat), 2):
            priority = score_priority(flat[i])
            for label, lo, hi in BANDS:
                if lo <= priority <= hi:
                    depth[label] += int(flat[i + 1])
        return depth

    # --- data loss ---------------------------------------------------------------
    def mark_built(self, at: float) -> None:
        self.redis.set(keys.BUILT, repr(at))

    def is_built(self) -> bool:
        """False once Redis has lost its data (FLUSHALL, a restart without persistence)."""
        return bool(self.redis.exists(keys.BUILT))
