"""Every Redis key Tidal uses is built here, and nowhere else.

Redis holds only what SQL can rebuild (see ``enqueue.rebuild``). Layout version 2 (model, priority, tenant), one DB;
the keys of the phase split were added to it without a new version: Redis written before them holds no split item and reads
the same, and a release without them requeues a split item it reclaims as a whole one, which runs correctly.

=================================================  ======  =========================================================
key                                                type    content
=================================================  ======  =========================================================
``tidal:ql:{model}``                               ZSET    the model's priority levels holding queued batches:
                                                           priority -> priority. A tenant's claims take its most
                                                           urgent level first.
``tidal:qt:{priority}:{model}``                    ZSET    the tenants with queued batches at that level ->
                                                           -1 once a claim has taken the tenant into the
                                                           model's passes (``tidal:qs``), else 0 (``link``
                                                           adds it so): how a claim finds the
                                                           tenants new to the model without reading them all.
``tidal:qs:{model}``                               ZSET    the tenants with queued whole items of the model, at
                                                           any level: tenant -> pass. A claim serves the lowest
                                                           pass (ties by name) and adds ``1 / weight`` to it
                                                           per item (stride scheduling: items shared by weight,
                                                           round robin at equal weights, across the fleet and
                                                           the levels). Kept by ``CLAIM``: a tenant joining
                                                           starts at the lowest pass of those queued, one found
                                                           with nothing queued leaves, and the key goes with the
                                                           claim that finds the model empty.
``tidal:qv:{model}``                               HASH    layout 2's per-level virtual times: no longer written
                                                           or read (the passes moved to ``tidal:qs``); ``prune``
                                                           deletes a level's field an upgrade left behind.
``tidal:qb:{priority}:{len(tenant)}:{tenant}:{model}``  ZSET    one tenant's batches at one level: batch -> deadline
                                                           (EDF within a tenant). ``len`` is in UTF-8 bytes, so a
                                                           tenant or model holding ``:`` cannot collide.
``tidal:weight``                                   HASH    tenant -> claim weight (``Settings.limits_for``),
                                                           written by every enqueue; absent = 1.
``tidal:batches``                                  ZSET    every batch with queued items, whole or split ->
                                                           ``priority * 1e10 + deadline``:
                                                           the index the gauges and ``rebuild`` read (and the
                                                           claim order of layout 1, kept so its workers drain
                                                           during an upgrade).
``tidal:batch:{batch}``                            HASH    ``score``, ``model``, ``tenant``: where the open batch
                                                           is queued. Absent = dropped (cancelled, expired,
                                                           finalized): its leases are not requeued.
``tidal:b:{batch}:ready``                          ZSET    item_id -> ordinal (prompt-prefix order): the
                                                           batch's queued whole items.
``tidal:b:{batch}:{phase}``                        ZSET    Phase split: the batch's queued split items whose next run is
                                                           ``phase`` (``prefill`` or ``decode``): item_id ->
                                                           ordinal. Claimed only through ``tidal:qp``.
``tidal:qp:{phase}:{model}``                       ZSET    Phase split: the model's batches with queued items of
                                                           ``phase`` -> batch score (as ``tidal:batches``): a
                                                           phase claim takes the lowest, when the node's slack
                                                           (or the batch's urgency) admits that phase.
``tidal:item:{item}``                              HASH    ``batch``, ``ord``, ``phase`` (``whole``, ``prefill``,
                                                           ``decode``: which set it goes back to), ``attempts``
                                                           (fencing counter, bumped by every claim).
``tidal:inflight``                                 ZSET    item_id -> lease expiry (Redis clock, epoch s).
``tidal:node:{node}:inflight``                     ZSET    the same, for one node's leases.
``tidal:node:{node}:models``                       SET     the models the node's engine serves (its
                                                           ``/v1/models``); expires unless the node's claim loop
                                                           refreshes it. No live node's set holds a batch's
                                                           model: the batch waits, and its ``tidal`` extension
                                                           says so.
``tidal:nodes``                                    SET     nodes that have claimed or published their models.
``tidal:lease``                                    HASH    item_id -> ``node|attempt|claim-µs``: the current
                                                           lease; a result under any other lease is stale.
``tidal:rate:{batch}``                             HASH    the batch's observed-rate estimator between re-score
                                                           passes (``last_at``, ``last_done``, ``mean``,
                                                           ``weight``, ``seen``); lost = the estimate starts over.
                                                           Expires after 4 tau.
``tidal:trate:{len(tenant)}:{tenant}:{model}``     HASH    the same estimator for one tenant's batches of a
                                                           model together, fed the items they settle (its
                                                           laxity is the tenant's), and ``b:{batch}`` -> each
                                                           batch's settled count at the last pass (so a batch
                                                           that ended since still counts its last items).
``tidal:urgent``                                   SET     batches past ``floor_urgency``, rebuilt by every
                                                           re-score pass: the claim loop's floor admits their
                                                           tenants.
``tidal:built``                                    STRING  JSON ``{"layout": 2, "at": time}`` of the last rebuild
                                                           from SQL. Absent (Redis lost its data) or of another
                                                           layout (an upgrade): the next worker pass rebuilds.
``tidal:redbeat:*``                                (many)  RedBeat's schedule entries and its beat lock.
``tidal:storage:sentinel``                         STRING  the fleet's storage sentinel (JSON: blob name,
                                                           contents, writer, location), set by the first process
                                                           to start; every later one must read that blob
                                                           (``blobs.sentinel``). Lost = the next process to start
                                                           records its own.
=================================================  ======  =========================================================

A claim therefore reads model -> tenant -> priority -> batch -> item: the tenants' shares first (models served by one
node take turns), then the tenant's most urgent level, its earliest deadline there, then prompt-prefix order inside
the batch. Split items wait outside
that walk, by phase: a phase claim reads ``tidal:qp:{phase}:{model}`` (lowest priority, then deadline) and the
batch's set of that phase, and an item's hash says where it goes back. Items' phases live in SQL
(``items.phase``), so a rebuild puts each one back in the right set. In every name the free-form parts
come after the fixed-form ones, the model last and a tenant after its length, so no two names collide whatever
``:`` a model or tenant holds.

Celery's broker keys (``<worker>.dq2``, ``tidal.ops``, ``tidal.ingest``, ``_kombu.*``) share the DB.
The Lua scripts in ``queue.py`` build names with :data:`LUA`, generated below from the same prefixes, so the
layout is still written only here (one Redis, not Cluster: the scripts build those names at run time).
"""

from __future__ import annotations

import re

NS = "tidal:"
LAYOUT = 2  # bumped with every change of the layout above; a worker rebuilds from SQL when it differs

BATCHES = NS + "batches"
INFLIGHT = NS + "inflight"
LEASES = NS + "lease"
NODES = NS + "nodes"
BUILT = NS + "built"
URGENT = NS + "urgent"
WEIGHTS = NS + "weight"
REDBEAT_PREFIX = NS + "redbeat:"
STORAGE_SENTINEL = NS + "storage:sentinel"

BATCH_PREFIX = NS + "batch:"
READY_PREFIX, READY_SUFFIX = NS + "b:", ":ready"
ITEM_PREFIX = NS + "item:"
RATE_PREFIX = NS + "rate:"
TENANT_RATE_PREFIX = NS + "trate:"
NODE_PREFIX, NODE_SUFFIX, MODELS_SUFFIX = NS + "node:", ":inflight", ":models"
LEVELS_PREFIX = NS + "ql:"
TENANTS_PREFIX = NS + "qt:"
VTIME_PREFIX = NS + "qv:"
TENANT_BATCHES_PREFIX = NS + "qb:"
SHARES_PREFIX = NS + "qs:"
PHASE_BATCHES_PREFIX = NS + "qp:"


def batch(batch_id: str) -> str:
    return f"{BATCH_PREFIX}{batch_id}"


def ready(batch_id: str) -> str:
    return f"{READY_PREFIX}{batch_id}{READY_SUFFIX}"


def phase_ready(batch_id: str, phase: str) -> str:
    return f"{READY_PREFIX}{batch_id}:{phase}"


def phase_batches(phase: str, model: str) -> str:
    return f"{PHASE_BATCHES_PREFIX}{phase}:{model}"


def rate(batch_id: str) -> str:
    return f"{RATE_PREFIX}{batch_id}"


def tenant_rate(model: str, tenant: str) -> str:
    return f"{TENANT_RATE_PREFIX}{len(tenant.encode())}:{tenant}:{model}"


def item(item_id: int | str) -> str:
    return f"{ITEM_PREFIX}{item_id}"


def node_inflight(node: str) -> str:
    return f"{NODE_PREFIX}{node}{NODE_SUFFIX}"


def node_models(node: str) -> str:
    return f"{NODE_PREFIX}{node}{MODELS_SUFFIX}"


def levels(model: str) -> str:
    return f"{LEVELS_PREFIX}{model}"


def vtime(model: str) -> str:
    return f"{VTIME_PREFIX}{model}"


def shares(model: str) -> str:
    return f"{SHARES_PREFIX}{model}"


def tenants(model: str, priority: int) -> str:
    return f"{TENANTS_PREFIX}{priority}:{model}"


def tenant_batches(model: str, priority: int, tenant: str) -> str:
    return f"{TENANT_BATCHES_PREFIX}{priority}:{len(tenant.encode())}:{tenant}:{model}"


def _lua(text: str) -> str:
    """A Lua string literal of a key prefix (plain printable ASCII: nothing to escape)."""
    assert re.fullmatch(r"[A-Za-z0-9:_.\-]*", text), text
    return f"'{text}'"


#: The same names in Lua, prepended to every script of ``queue.py`` that builds them (``#t`` counts bytes, as
#: ``len(t.encode())`` does above).
LUA = f"""
local K = {{BATCHES = {_lua(BATCHES)}, WEIGHTS = {_lua(WEIGHTS)}, ITEM = {_lua(ITEM_PREFIX)}}}
function K.batch(b) return {_lua(BATCH_PREFIX)} .. b end
function K.ready(b) return {_lua(READY_PREFIX)} .. b .. {_lua(READY_SUFFIX)} end
function K.phase_ready(b, ph) return {_lua(READY_PREFIX)} .. b .. ':' .. ph end
function K.phase_batches(ph, m) return {_lua(PHASE_BATCHES_PREFIX)} .. ph .. ':' .. m end
function K.item(i) return {_lua(ITEM_PREFIX)} .. i end
function K.node_inflight(n) return {_lua(NODE_PREFIX)} .. n .. {_lua(NODE_SUFFIX)} end
function K.levels(m) return {_lua(LEVELS_PREFIX)} .. m end
function K.vtime(m) return {_lua(VTIME_PREFIX)} .. m end
function K.shares(m) return {_lua(SHARES_PREFIX)} .. m end
function K.tenants(m, p) return {_lua(TENANTS_PREFIX)} .. p .. ':' .. m end
function K.tenant_batches(m, p, t) return {_lua(TENANT_BATCHES_PREFIX)} .. p .. ':' .. #t .. ':' .. t .. ':' .. m end
"""
