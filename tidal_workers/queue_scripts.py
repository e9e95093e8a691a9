"""The queue's Lua: every script ``Queue`` runs, each opening with its KEYS/ARGV header.

Kept apart from ``queue.py``, the Python face that registers and calls them, as python-rq keeps ``scripts.py``.
Key names come from ``keys.LUA``, prepended to every script that builds one (layout: ``keys.py``). Times inside
the scripts come from Redis's clock, so nodes never compare their own clocks.
"""

from __future__ import annotations

from tidal_workers import keys

# Shared by every script that moves a batch in or out of the claim structure (keys.py: model -> priority ->
# tenant -> batch). A batch is linked while it has queued whole items; whoever empties its ready set unlinks it.
# Split items wait beside that tree, by phase; tidal:batches indexes a batch while it has items of any kind.
_PLACEMENT = (
    keys.LUA
    + """
local SCALE = 1e10
-- Where a batch is queued, from its hash: score, priority p, deadline, model, tenant; nil once it is dropped.
-- A hash of layout 1 has no model or tenant: such a batch is claimable only by layout 1 until a rebuild.
local function place(b)
  local h = redis.call('HMGET', K.batch(b), 'score', 'model', 'tenant')
  if not h[1] then return nil end
  local score = tonumber(h[1])
  local p = math.floor(score / SCALE)
  return {score = score, p = p, deadline = score - p * SCALE, model = h[2], tenant = h[3]}
end
local function link(b)
  local at = place(b)
  if not at then return end
  redis.call('ZADD', K.BATCHES, at.score, b)
  if not (at.model and at.tenant) then return end
  redis.call('ZADD', K.tenant_batches(at.model, at.p, at.tenant), at.deadline, b)
  local ts = K.tenants(at.model, at.p)
  if not redis.call('ZSCORE', ts, at.tenant) then  -- 0: new to the model's turns (CLAIM marks those it took -1)
    redis.call('ZADD', ts, 0, at.tenant)
  end
  redis.call('ZADD', K.levels(at.model), at.p, at.p)
end
-- A tenant leaves a level when it has no batch there; the level goes (with its virtual time) when no tenant is left.
local function prune(m, p, tenant)
  if redis.call('EXISTS', K.tenant_batches(m, p, tenant)) == 1 then return end
  local ts = K.tenants(m, p)
  redis.call('ZREM', ts, tenant)
  if redis.call('EXISTS', ts) == 0 then
    redis.call('ZREM', K.levels(m), p)
    redis.call('HDEL', K.vtime(m), p)  -- layout 2's virtual time of the level, if an upgrade left one
  end
end
-- Out of tidal:batches unless split items of the batch still wait.
local function unindex(b)
  if redis.call('EXISTS', K.phase_ready(b, 'prefill'), K.phase_ready(b, 'decode')) == 0 then
    redis.call('ZREM', K.BATCHES, b)
  end
end
local function unlink_at(b, m, p, tenant)
  unindex(b)
  redis.call('ZREM', K.tenant_batches(m, p, tenant), b)
  prune(m, p, tenant)
end
local function unlink(b)
  unindex(b)
  local at = place(b)
  if at and at.model and at.tenant then unlink_at(b, at.model, at.p, at.tenant) end
end
-- Phase split: a split item waits in its batch's set of its phase, and the batch in the phase's set for its model (and in
-- tidal:batches) at its score while it has some: linked again after a re-score, which moves that score.
local PHASES = {'prefill', 'decode'}
local function link_phase(b, ph)
  local at = place(b)
  if not (at and at.model) then return end
  if redis.call('EXISTS', K.phase_ready(b, ph)) == 1 then
    redis.call('ZADD', K.phase_batches(ph, at.model), at.score, b)
    redis.call('ZADD', K.BATCHES, at.score, b)
  else
    redis.call('ZREM', K.phase_batches(ph, at.model), b)
  end
end
local function unlink_phases(b)
  local at = place(b)
  if not (at and at.model) then return end
  for _, ph in ipairs(PHASES) do redis.call('ZREM', K.phase_batches(ph, at.model), b) end
end
-- The set an item of phase `ph` waits in (whole items: the ready set).
local function waiting_set(b, ph)
  if ph == 'prefill' or ph == 'decode' then return K.phase_ready(b, ph) end
  return K.ready(b)
end
-- An item back into its batch at its ordinal, as its hash's phase; the batch back where it is claimed.
local function requeue(id, b, ord, ph)
  redis.call('ZADD', waiting_set(b, ph), ord, id)
  if waiting_set(b, ph) == K.ready(b) then link(b) else link_phase(b, ph) end
end
"""
)

ENQUEUE = (
    _PLACEMENT
    + """
-- KEYS[1] = tidal:lease  KEYS[2] = tidal:batch:{batch}  KEYS[3] = tidal:b:{batch}:ready
-- ARGV[1] = batch id  ARGV[2] = batch score  ARGV[3] = model  ARGV[4] = tenant  ARGV[5] = the tenant's weight
-- ARGV[6..] = item id, ordinal, phase triples. Items holding a lease are in flight and skipped.
-- Records where the batch is queued (moving it if its score, model or tenant changed: a rebuild after a re-score
-- or from layout 1) and links it once it has queued items. An item queued under another phase before (its
-- prefill answered since) leaves that phase's set. Returns the number of items queued.
local b = ARGV[1]
local at = place(b)
if at and (at.score ~= tonumber(ARGV[2]) or at.model ~= ARGV[3] or at.tenant ~= ARGV[4]) then
  unlink(b)
  unlink_phases(b)
end
redis.call('HSET', KEYS[2], 'score', ARGV[2], 'model', ARGV[3], 'tenant', ARGV[4])
redis.call('HSET', K.WEIGHTS, ARGV[4], ARGV[5])
local n = 0
for i = 6, #ARGV, 3 do
  local id, ph = ARGV[i], ARGV[i + 2]
  if redis.call('HEXISTS', KEYS[1], id) == 0 then
    local was = redis.call('HGET', K.item(id), 'phase')
    if was and was ~= ph then redis.call('ZREM', waiting_set(b, was), id) end
    redis.call('HSET', K.item(id), 'batch', b, 'ord', ARGV[i + 1], 'phase', ph)
    redis.call('ZADD', waiting_set(b, ph), ARGV[i + 1], id)
    n = n + 1
  end
end
if redis.call('ZCARD', KEYS[3]) > 0 then link(b) end
for _, ph in ipairs(PHASES) do link_phase(b, ph) end
return n
"""
)

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
-- ARGV[1] = node  ARGV[2] = most items to claim  ARGV[3] = lease seconds  ARGV[4] = turn
-- ARGV[5] = 1 to claim whole items after the split ones, 0 for split items only
-- ARGV[6] = k, the phases to claim split items of  ARGV[7 .. 6 + 2k] = phase, highest batch score, in claim order
-- ARGV[7 + 2k ..] = the models the node's engine serves
-- One claim pass in one call. First the split items, phase by phase: the lowest-score batch (priority, then
-- deadline) of those models with items of that phase queued, at most the phase's highest score, its lowest
-- ordinals, then the next batch. Then whole items, item by item, as if one at a time: the models with whole items
-- queued take turns (from `turn`); in the model, the tenant of lowest pass whatever the levels its batches are at
-- (ties by name), whose pass then grows by 1 / its weight per item; that tenant's most urgent level, its
-- earliest-deadline batch there, its lowest ordinals. A tenant takes at once the items it would take in a row (all
-- of them when it is alone). Leases each item.
-- Returns {item id, lease, batch id, ...}, split items first.
"""
    + _PLACEMENT
    + _LEASE
    + """
local k = tonumber(ARGV[6])
local models = {}
for i = 7 + 2 * k, #ARGV do models[#models + 1] = ARGV[i] end
local want = tonumber(ARGV[2])
for j = 0, k - 1 do
  local ph, highest = ARGV[7 + 2 * j], tonumber(ARGV[8 + 2 * j])
  while want > 0 do
    local b, from, best = nil, nil, nil
    for _, m in ipairs(models) do
      local top = redis.call('ZRANGE', K.phase_batches(ph, m), 0, 0, 'WITHSCORES')
      if #top > 0 and tonumber(top[2]) <= highest and (best == nil or tonumber(top[2]) < best) then
        b, from, best = top[1], m, tonumber(top[2])
      end
    end
    if not b then break end
    local popped = redis.call('ZPOPMIN', K.phase_ready(b, ph), want)
    lease(popped, b, K.ITEM)
    want = want - #popped / 2
    if redis.call('EXISTS', K.phase_ready(b, ph)) == 0 then
      redis.call('ZREM', K.phase_batches(ph, from), b)
      if redis.call('EXISTS', K.ready(b)) == 0 then unindex(b) end
    end
  end
end
if ARGV[5] ~= '1' then return out end
-- The model's most urgent level holding batches of `tenant`, or nil: it has none queued.
local function level_of(m, tenant)
  for _, p in ipairs(redis.call('ZRANGE', K.levels(m), 0, -1)) do
    if redis.call('EXISTS', K.tenant_batches(m, p, tenant)) == 1 then return p end
  end
  return nil
end
-- The model's passes (K.shares) take in the tenants that came to one of its levels since the last claim: link()
-- puts a tenant on a level at a score of 0 or more, and a claim marks it there with -1 once the passes hold it (with
-- `all`, every tenant is taken: the passes were lost). A tenant new to the passes starts at the lowest pass of those
-- queued, so it neither waits behind them nor takes a burst to catch up; a tenant found with nothing queued (its
-- batches dropped) leaves them first. Returns whether the model has a tenant to serve.
local function join(m, all)
  local sh, least = K.shares(m), nil
  while true do
    local top = redis.call('ZRANGE', sh, 0, 0, 'WITHSCORES')
    if #top == 0 then break end
    if level_of(m, top[1]) then
      least = tonumber(top[2])
      break
    end
    redis.call('ZREM', sh, top[1])
  end
  for _, p in ipairs(redis.call('ZRANGE', K.levels(m), 0, -1)) do
    local ts = K.tenants(m, p)
    if all and redis.call('EXISTS', ts) == 0 then redis.call('ZREM', K.levels(m), p) end
    for _, tenant in ipairs(redis.call('ZRANGEBYSCORE', ts, all and '-inf' or 0, '+inf')) do
      redis.call('ZADD', sh, 'NX', least or 0, tenant)
      redis.call('ZADD', ts, 'XX', -1, tenant)
    end
  end
  return redis.call('EXISTS', sh) == 1
end
local active = {}  -- the models with a tenant to serve, in turn
for _, m in ipairs(models) do
  if redis.call('EXISTS', K.levels(m)) == 0 then
    redis.call('DEL', K.shares(m))  -- nobody queued: the passes go
  elseif join(m, false) or join(m, true) then
    active[#active + 1] = m
  end
end
local turn = tonumber(ARGV[4])
-- Every pass claims items or removes something empty, so the loop ends.
while want > 0 and #active > 0 do
  turn = turn + 1
  local slot = turn % #active + 1
  local m = active[slot]
  local sh = K.shares(m)
  local top = redis.call('ZRANGE', sh, 0, 1, 'WITHSCORES')
  local tenant, pass = top[1], tonumber(top[2])
  local p = tenant and level_of(m, tenant)
  if not tenant then
    table.remove(active, slot)
  elseif not p then
    redis.call('ZREM', sh, tenant)  -- nothing queued any more
  else
    local b = redis.call('ZRANGE', K.tenant_batches(m, p, tenant), 0, 0)[1]
    local weight = tonumber(redis.call('HGET', K.WEIGHTS, tenant) or 1)
    local run = 1  -- items in a row: while its pass stays below the next tenant's (a tie goes back to ZRANGE)
    if #active == 1 then
      run = want
      if #top > 2 then run = math.max(1, math.ceil((tonumber(top[4]) - pass) * weight)) end
    end
    local popped = redis.call('ZPOPMIN', K.ready(b), math.min(run, want))
    local got = #popped / 2
    if got > 0 then
      lease(popped, b, K.ITEM)
      redis.call('ZADD', sh, pass + got / weight, tenant)
      want = want - got
    end
    if redis.call('EXISTS', K.ready(b)) == 0 then
      unlink_at(b, m, p, tenant)
      if not level_of(m, tenant) then redis.call('ZREM', sh, tenant) end
    end
  end
end
return out
"""
)

CLAIM_BATCH = (
    """
-- KEYS[1] = tidal:batches  KEYS[2] = tidal:inflight  KEYS[3] = tidal:node:{node}:inflight
-- KEYS[4] = tidal:lease    KEYS[5] = tidal:nodes     KEYS[6] = tidal:b:{batch}:ready
-- ARGV[1] = node  ARGV[2] = most items to claim  ARGV[3] = lease seconds
-- ARGV[4] = batch id  ARGV[5..] = the models the node's engine serves
-- The floor's claim: pops the lowest-ordinal items of one named batch, whatever its score and its tenant's
-- pass (the floor serves urgency, one bucket per tenant, capped by the claim loop), if the node serves its model,
-- and leases each one: whole items first, then
-- split ones (the phase split), decodes before prefills, whatever the node's slack. Returns {item id, lease, batch id, ...}.
"""
    + _PLACEMENT
    + _LEASE
    + """
local b = ARGV[4]
local at = place(b)
local served = false
for i = 5, #ARGV do
  if at and ARGV[i] == at.model then served = true end
end
if not served then return out end
local want = tonumber(ARGV[2])
for _, set in ipairs({KEYS[6], K.phase_ready(b, 'decode'), K.phase_ready(b, 'prefill')}) do
  if want > 0 then
    local popped = redis.call('ZPOPMIN', set, want)
    lease(popped, b, K.ITEM)
    want = want - #popped / 2
  end
end
for _, ph in ipairs(PHASES) do link_phase(b, ph) end
if redis.call('EXISTS', KEYS[6]) == 0 then unlink(b) end
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
-- KEYS[3 + i] = tidal:item:{item i}
-- ARGV[2i - 1] = item i's id  ARGV[2i] = its lease (a lease of KEYS[2]'s node)
-- Forgets each item whose lease is still ARGV[2i]; returns {1, or 0 for a stale attempt, ...} in order.
local out = {}
for i = 1, #ARGV / 2 do
  local id = ARGV[2 * i - 1]
  if redis.call('HGET', KEYS[3], id) == ARGV[2 * i] then
    redis.call('HDEL', KEYS[3], id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('DEL', KEYS[3 + i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

RECLAIM = (
    keys.LUA
    + """
-- KEYS[1] = tidal:inflight  KEYS[2] = tidal:lease  ARGV[1] = most leases to take
-- Takes expired leases (their worker died, or lost Redis past its lease) off their items. An item of a batch still
-- queued is then neither leased nor queued until ``REQUEUE`` puts it back or forgets it, once SQL has counted the
-- reclaim (``reclaim.py``); if that never comes (the reclaimer died), the next rebuild queues it again, as any
-- pending item without a lease. An item of a dropped batch is abandoned.
-- Returns {item id, its lease, batch id or '', 1 = taken / 0 = abandoned, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(expired) do
  local lease = redis.call('HGET', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  if lease then
    local node = string.match(lease, '^(.*)|%d+|%d+$')
    if node then redis.call('ZREM', K.node_inflight(node), id) end
  end
  local b = redis.call('HGET', K.item(id), 'batch')
  out[#out + 1] = id; out[#out + 1] = lease or ''; out[#out + 1] = b or ''
  if b and redis.call('EXISTS', K.batch(b)) == 1 then
    out[#out + 1] = 1
  else
    redis.call('DEL', K.item(id))
    out[#out + 1] = 0
  end
end
return out
"""
)

REQUEUE = (
    _PLACEMENT
    + """
-- KEYS[1] = tidal:lease  ARGV[1..] = item id, 1 = requeue / 0 = forget, pairs: items ``RECLAIM`` took
-- Puts each item to requeue back in its batch at its ordinal, as its phase (``requeue``), and the batch back into
-- the claim structure where its hash places it. Forgets each other one (settled, or written off as lost): its hash,
-- and its place if a rebuild queued it meanwhile. An item a lease holds again (a rebuild queued it and a node
-- claimed it) is left to that lease; one whose batch was dropped meanwhile is abandoned. Returns how many requeued.
local n = 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], id) == 0 then
    local f = redis.call('HMGET', K.item(id), 'batch', 'ord', 'phase')
    if ARGV[i + 1] == '1' and f[1] and redis.call('EXISTS', K.batch(f[1])) == 1 then
      requeue(id, f[1], f[2], f[3])
      n = n + 1
    else
      if f[1] then redis.call('ZREM', waiting_set(f[1], f[3]), id) end
      redis.call('DEL', K.item(id))
    end
  end
end
return n
"""
)

GIVE_BACK = (
    _PLACEMENT
    + """
-- KEYS[1] = tidal:inflight  KEYS[2] = tidal:node:{node}:inflight  KEYS[3] = tidal:lease
-- ARGV[1] = item id  ARGV[2] = lease  ARGV[3] = the phase it goes back as ('' = its own)
-- A claim that never reached the engine goes back to its batch at its ordinal (``requeue``), and the batch back
-- into the claim structure where its hash places it, if ARGV[2] is still its lease; an item of a dropped batch is
-- abandoned. A split item's answered prefill comes back this way as its decode (ARGV[3] = 'decode').
-- Returns {1 = requeued / 2 = abandoned / 0 = the lease was not current, batch id or ''}.
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return {0, ''}
end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local f = redis.call('HMGET', K.item(ARGV[1]), 'batch', 'ord', 'phase')
if not (f[1] and redis.call('EXISTS', K.batch(f[1])) == 1) then
  redis.call('DEL', K.item(ARGV[1]))
  return {2, f[1] or ''}
end
if ARGV[3] ~= '' then
  f[3] = ARGV[3]
  redis.call('HSET', K.item(ARGV[1]), 'phase', ARGV[3])
end
requeue(ARGV[1], f[1], f[2], f[3])
return {1, f[1]}
"""
)

RESCORE = (
    _PLACEMENT
    + """
-- KEYS[1] = tidal:batch:{batch}  ARGV[1] = batch id  ARGV[2] = new score
-- Moves the batch (its tenant's set at its new level) whatever its size; leased items pick the score up if they
-- are requeued. Returns 0 if the batch is not open in Redis.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local linked = redis.call('EXISTS', K.ready(ARGV[1])) == 1  -- in the claim tree (split items wait beside it)
if linked then unlink(ARGV[1]) end
redis.call('HSET', KEYS[1], 'score', ARGV[2])
if linked then link(ARGV[1]) end
for _, ph in ipairs(PHASES) do link_phase(ARGV[1], ph) end
return 1
"""
)

DROP = (
    _PLACEMENT
    + """
-- KEYS[1] = tidal:batch:{batch}  KEYS[2] = tidal:b:{batch}:ready  ARGV[1] = batch id
-- Forgets a batch's queued items (whole and split) at once; its leased items finish or are abandoned.
-- Returns the number of queued items dropped.
unlink(ARGV[1])
unlink_phases(ARGV[1])
redis.call('DEL', KEYS[1])
local n = 0
for _, set in ipairs({KEYS[2], K.phase_ready(ARGV[1], 'prefill'), K.phase_ready(ARGV[1], 'decode')}) do
  local ids = redis.call('ZRANGE', set, 0, -1)
  for _, id in ipairs(ids) do
    redis.call('DEL', K.item(id))
  end
  redis.call('DEL', set)
  n = n + #ids
end
redis.call('ZREM', K.BATCHES, ARGV[1])
return n
"""
)

BATCH_INFLIGHT = (
    keys.LUA
    + """
-- KEYS[1] = tidal:inflight  ARGV[1] = batch id
-- Counts the batch's leased items (scans every lease: bounded by the fleet's in-flight total).
local n = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if redis.call('HGET', K.item(id), 'batch') == ARGV[1] then n = n + 1 end
end
return n
"""
)

DEPTH = (
    keys.LUA
    + """
-- KEYS[1] = tidal:batches
-- Returns {batch score, queued items (whole and split), ...} for every queued batch.
local out = {}
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local b = all[i]
  out[#out + 1] = all[i + 1]
  out[#out + 1] = redis.call('ZCARD', K.ready(b)) + redis.call('ZCARD', K.phase_ready(b, 'prefill'))
    + redis.call('ZCARD', K.phase_ready(b, 'decode'))
end
return out
"""
)
