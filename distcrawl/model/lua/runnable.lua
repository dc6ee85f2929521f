-- runnable.lua: how many requests the crawl could run now within its politeness, the signal
-- to scale workers on. A queue's length is the wrong one for a polite crawl: 100,000 URLs of
-- one domain at concurrency 4 keep 4 requests busy, not 100,000. Over the slots whose turn
-- has come (ready, score <= now): min(requests waiting in the slot, its concurrency) minus
-- its requests in flight; plus the start URLs waiting (their slots are not known yet: each
-- counts as one request, up to the cap). A paused crawl can run nothing: 0.
--
-- Run by the elected reaper (distcrawl/engine/batch.py) every DISTCRAWL_RECLAIM_INTERVAL;
-- optionally mirrored into a LIST of that many one-byte elements (KEYS[9]), because KEDA's
-- stock Redis scaler reads the length of a list (docs/operations.md, "Autoscaling").
--
-- KEYS[1] ready           ZSET   slot -> when its next request may be leased (ms)
-- KEYS[2] queue           ZSET   queue entries (see lib.lua), all scores 0
-- KEYS[3] revisit_queue   ZSET   due revisits' queue entries, laid out as KEYS[2]
-- KEYS[4] inflight        HASH   slot -> leased requests that hold a place
-- KEYS[5] limits          HASH   slot -> "<delay ms>:<concurrency>" set while the crawl runs
-- KEYS[6] throttle_state  HASH   slot -> "<cap>:<share>:<hold>": a cap of 1 or more lowers
--                                the slot's concurrency to it (commit.lua)
-- KEYS[7] paused          STRING exists while the crawl is paused
-- KEYS[8] start_urls      LIST   raw entries pushed by producers
-- KEYS[9] runnable        LIST   the mirror: one element per request runnable now
-- The last three are the crawl's own keys, passed only with 'set' (one shard, or the crawl's
-- call of a sharded crawl): a shard's call passes the first six, its slot state, and counts
-- only (on a cluster the crawl's keys are in another hash slot than the shard's)
--
-- ARGV[1] default concurrency of a slot
-- ARGV[2] per-slot defaults from the settings, JSON {slot: [delay ms, concurrency]} (-1 for
--         a value not set), or ''
-- ARGV[3] how many due slots to look at, at most (bounded work per call: past it the count
--         is a lower bound, and already more than any sane number of workers needs)
-- ARGV[4] the count is capped at this (the mirror's length too)
-- ARGV[5] 'set' to write the mirror (the count plus ARGV[6]); '' to count only (a shard of
--         a sharded crawl: the caller adds the shards up and sets the crawl's mirror)
-- ARGV[6] added to this call's count before it is capped and mirrored (other shards')
--
-- Returns {runnable (capped), due slots looked at, due slots in all}.

local default_conc = tonumber(ARGV[1])
local overrides = {}
if ARGV[2] ~= '' then overrides = cjson.decode(ARGV[2]) end
local scan, cap, mirror = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == 'set'
local total, looked, due = tonumber(ARGV[6]) or 0, 0, 0

if mirror and redis.call('EXISTS', KEYS[7]) == 1 then
  total = 0  -- paused: nothing runs, whatever the shards counted
else
  local now = now_ms()
  due = redis.call('ZCOUNT', KEYS[1], '-inf', now)
  local slots = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, scan)
  looked = #slots
  if looked > 0 then
    local sets = redis.call('HMGET', KEYS[5], unpack(slots))
    local caps = redis.call('HMGET', KEYS[6], unpack(slots))
    local flying = redis.call('HMGET', KEYS[4], unpack(slots))
    for i, slot in ipairs(slots) do
      local conc = default_conc
      local o = overrides[slot]
      if o and o[2] >= 0 then conc = o[2] end
      if sets[i] then
        local c = string.match(sets[i], '^%d*:(%d*)$')
        conc = tonumber(c) or conc
      end
      if caps[i] then
        local conc_cap = tonumber(string.match(caps[i], '^([%d.]+):'))
        if conc_cap and conc_cap >= 1 then conc = math.min(conc, math.floor(conc_cap)) end
      end
      local lo, hi = slot_range(slot)
      local waiting = redis.call('ZLEXCOUNT', KEYS[2], lo, hi)
      if waiting < conc then
        waiting = waiting + redis.call('ZLEXCOUNT', KEYS[3], lo, hi)
      end
      local room = math.min(waiting, conc) - (tonumber(flying[i]) or 0)
      if room > 0 then total = total + room end
    end
  end
  if mirror then total = total + redis.call('LLEN', KEYS[8]) end
end
total = math.min(total, cap)

if mirror then
  local have = redis.call('LLEN', KEYS[9])
  if total > have then
    local add = {}
    for i = 1, total - have do
      add[#add + 1] = '1'
      if #add == CALL_CHUNK then
        redis.call('RPUSH', KEYS[9], unpack(add))
        add = {}
      end
    end
    if #add > 0 then redis.call('RPUSH', KEYS[9], unpack(add)) end
  elseif total == 0 then
    redis.call('DEL', KEYS[9])
  elseif total < have then
    redis.call('LTRIM', KEYS[9], 0, total - 1)
  end
end
return {total, looked, due}
