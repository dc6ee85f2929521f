-- places.lua: a worker's report on the places of its leased requests in their slots.
--
-- Freed: these requests left the downloader (answered, or failed), so they are no longer at
-- the site, and their places are given back now, not when they are acknowledged. The
-- acknowledgement waits for the page's children and items to be stored (an item pipeline
-- batching its writes can take longer than the download); a slot whose places stayed taken
-- until then would see far fewer requests than its concurrency. The lease itself is kept
-- until the acknowledgement, so a worker dying now still loses nothing.
--
-- Taken: reserves (requests lease.lua handed out ahead, holding no place) that the worker
-- sent in the places of requests of the same slot that had left the downloader. It sends
-- first and reports after, which is safe: a freed place and the reserve that took it are
-- reported together (the freed ones first), so the count never dropped at the site and
-- never rises here above what the site sees.
--
-- KEYS[1] requests  HASH  request id -> record (token .. entry, see lib.lua)
-- KEYS[2] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[3] inflight  HASH  slot -> leased requests that hold a place
-- KEYS[4] robots    HASH  slot -> robots.txt Crawl-delay (ms), negative while being read
-- KEYS[5] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[6] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[7] placeless SET   ids of leased requests that hold no place
--
-- ARGV[1]  how many pairs of freed requests follow
-- ARGV[..] pairs: request id, lease token (freed, then taken)
--
-- Only a lease still held under the token counts: one that expired was requeued, which
-- settled its place already. Returns {places freed, places taken}.

local out = {0, 0}
local freed = tonumber(ARGV[1])

-- Every id's record, lease and place are read in one call each (HMGET, ZMSCORE,
-- SMISMEMBER) and written back in one call each, per slot once: a report of many requests
-- costs a handful of commands, not a handful per request. ``placeless`` follows what the
-- requests in order would do to the set, so that an id reported twice counts once.
local ids = {}
for i = 2, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then return out end
local records = call_many('HMGET', KEYS[1], ids)
local leased = call_many('ZMSCORE', KEYS[2], ids)
local member = {}
for n, flag in ipairs(call_many('SMISMEMBER', KEYS[7], ids)) do
  member[ids[n]] = flag == 1
end
local was = {}
for id, flag in pairs(member) do was[id] = flag end

-- the slot of the n-th id when its lease is held under the token presented, else nil
local function held(n, token)
  local record = records[n]
  local slot = record and string.sub(record, 1, TOKEN_BYTES) == token
    and entry_slot(record, TOKEN_BYTES + 1)
  if slot and leased[n] then return slot end
  return nil
end

local landed_in, taken_in, slots_freed, slots_taken = {}, {}, {}, {}
for n = 1, freed do
  local id = ids[n]
  local slot = held(n, ARGV[2 * n + 1])
  if slot and not member[id] then
    member[id] = true
    if not landed_in[slot] then slots_freed[#slots_freed + 1] = slot end
    landed_in[slot] = (landed_in[slot] or 0) + 1
    out[1] = out[1] + 1
  end
end
for n = freed + 1, #ids do
  local id = ids[n]
  local slot = held(n, ARGV[2 * n + 1])
  if slot and member[id] then
    member[id] = false
    if not taken_in[slot] then slots_taken[#slots_taken + 1] = slot end
    taken_in[slot] = (taken_in[slot] or 0) + 1
    out[2] = out[2] + 1
  end
end

local add, remove, listed = {}, {}, {}
for _, id in ipairs(ids) do
  if not listed[id] then
    listed[id] = true
    if member[id] and not was[id] then add[#add + 1] = id end
    if was[id] and not member[id] then remove[#remove + 1] = id end
  end
end
call_many('SADD', KEYS[7], add)
call_many('SREM', KEYS[7], remove)
-- per slot, the places freed less the reserves' places taken: in one script the report's
-- order (freed first) needs no step of its own, and a swap (one of each, the usual report of
-- a worker with reserves) changes no count and frees no place, so the slot is not armed
-- again and the call needs no TIME: six commands instead of eleven
local armed = {}
for _, slot in ipairs(slots_freed) do
  local freed_here = landed_in[slot] - (taken_in[slot] or 0)
  if freed_here > 0 then
    landed(KEYS[3], KEYS[4], slot, freed_here)
    armed[#armed + 1] = slot
  else
    if freed_here < 0 then redis.call('HINCRBY', KEYS[3], slot, -freed_here) end
    probe_ended(KEYS[4], slot)
  end
end
if #armed > 0 then arm_many(KEYS[5], KEYS[6], armed, now_ms(), false) end
for _, slot in ipairs(slots_taken) do
  if not landed_in[slot] then redis.call('HINCRBY', KEYS[3], slot, taken_in[slot]) end
end
return out
