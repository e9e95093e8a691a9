"""Every Redis key Tidal uses is built here, and nowhere else.

Redis holds only what SQL can rebuild (see ``enqueue.rebuild``). Layout, one DB:

==============================  ======  ==================================================
key                             type    content
==============================  ======  ==================================================
``tidal:batches``               ZSET    batch_id -> ``priority * 1e10 + deadline`` (epoch
                                        seconds); lowest first = priority, then EDF. Exact
                                        below 2**53. A re-score is one ``ZADD XX`` here.
``tidal:batch:{batch}``         HASH    ``score``: the batch's current score, kept while
                                        the batch is open. Absent = dropped (cancelled,
                                        expired, finalized): its leases are not requeued.
``tidal:b:{batch}:ready``       ZSET    item_id -> ordinal (prompt-prefix order).
``tidal:item:{item}``           HASH    ``batch``, ``ord``, ``attempts`` (fencing counter,
                                        bumped by every claim).
``tidal:inflight``              ZSET    item_id -> lease expiry (Redis clock, epoch s).
``tidal:node:{node}:inflight``  ZSET    the same, for one node's leases.
``tidal:nodes``                 SET     nodes that have claimed (for the in-flight gauge).
``tidal:lease``                 HASH    item_id -> ``node|attempt|claim-µs``: the current
                                        lease; a result under any other lease is stale.
``tidal:rate:{batch}``          HASH    the batch's observed-rate estimator between
                                        re-score passes (``last_at``, ``last_done``,
                                        ``mean``, ``weight``, ``seen``); lost = the
                                        estimate starts over. Expires after 4 tau.
``tidal:urgent``                SET     batches past ``floor_urgency``, rebuilt by every
                                        re-score pass: the claim loop's floor admits them.
``tidal:built``                 STRING  time of the last rebuild from SQL; its absence
                                        tells a worker that Redis lost its data.
``tidal:redbeat:*``             (many)  RedBeat's schedule entries and its beat lock.
``tidal:storage:sentinel``      STRING  the fleet's storage sentinel (JSON: blob name,
                                        contents, writer, location), set by the first
                                        process to start; every later one must read that
                                        blob (``blobs.sentinel``). Lost = the next process
                                        to start records its own.
==============================  ======  ==================================================

Celery's broker keys (``<worker>.dq2``, ``tidal.ops``, ``_kombu.*``) share the DB.
The Lua scripts in ``queue.py`` receive the per-batch, per-item and per-node key
prefixes below as ARGV, so the layout is still written only here (one Redis, not
Cluster: the scripts build those names at run time).
"""

from __future__ import annotations

NS = "tidal:"

BATCHES = NS + "batches"
INFLIGHT = NS + "inflight"
LEASES = NS + "lease"
NODES = NS + "nodes"
BUILT = NS + "built"
URGENT = NS + "urgent"
REDBEAT_PREFIX = NS + "redbeat:"
STORAGE_SENTINEL = NS + "storage:sentinel"

BATCH_PREFIX = NS + "batch:"
READY_PREFIX, READY_SUFFIX = NS + "b:", ":ready"
ITEM_PREFIX = NS + "item:"
RATE_PREFIX = NS + "rate:"
NODE_PREFIX, NODE_SUFFIX = NS + "node:", ":inflight"


def batch(batch_id: str) -> str:
    return f"{BATCH_PREFIX}{batch_id}"


def ready(batch_id: str) -> str:
    return f"{READY_PREFIX}{batch_id}{READY_SUFFIX}"


def rate(batch_id: str) -> str:
    return f"{RATE_PREFIX}{batch_id}"


def item(item_id: int | str) -> str:
    return f"{ITEM_PREFIX}{item_id}"


def node_inflight(node: str) -> str:
    return f"{NODE_PREFIX}{node}{NODE_SUFFIX}"
