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
-- KEYS[2] inflight  HASH  slot -> leased requests that hold a place
-- KEYS[3] robots    HASH  slot -> robots.txt Crawl-delay (ms), negative while being read
-- KEYS[4] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[5] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[6] placeless SET   ids of leased requests that hold no place
--
-- ARGV[1]  how many pairs of freed requests follow
-- ARGV[..] pairs: request id, lease token (freed, then taken)
--
-- Only a lease still held under the token counts (its record carries the token: one that
-- expired was requeued, which settled its place already and marked the record's token,
-- lib.lua). Returns {places freed, places taken}.

local out = {0, 0}
local freed = tonumber(ARGV[1])

-- Every id's record and place are read in one call each (HMGET, SMISMEMBER) and written
-- back in one call each, per slot once: a report of many requests costs a handful of
-- commands, not a handful per request. ``placeless`` follows what the requests in order would
-- do to the set, so that an id reported twice counts once.
local ids = {}
for i = 2, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then return out end
local records = call_many('HMGET', KEYS[1], ids)
-- what SMISMEMBER said of each id (1: placeless) before this report, and what the report
-- makes of it, per id: one table keyed by id (a table grows by rehashing every key, a
-- report's ids each time)
local flags = call_many('SMISMEMBER', KEYS[6], ids)
local member = {}
for n, id in ipairs(ids) do member[id] = flags[n] == 1 end

-- the slot of the n-th id when its lease is held under the token presented, else nil
local function held(n, token)
  local record = records[n]
  return record and string.sub(record, 1, TOKEN_BYTES) == token
    and entry_slot(record, TOKEN_BYTES + 1) or nil
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

local add, remove = {}, {}
for n, id in ipairs(ids) do
  local after = member[id]
  if after ~= nil then
    member[id] = nil  -- each id once
    local was = flags[n] == 1
    if after and not was then
      add[#add + 1] = id
    elseif was and not after then
      remove[#remove + 1] = id
    end
  end
end
call_many('SADD', KEYS[6], add)
call_many('SREM', KEYS[6], remove)
-- per slot, the places freed less the reserves' places taken: in one script the report's
-- order (freed first) needs no step of its own, and a swap (one of each, the usual report of
-- a worker with reserves) changes no count and frees no place, so the slot is not armed
-- again and the call needs no TIME: six commands instead of eleven
local armed = {}
for _, slot in ipairs(slots_freed) do
  local freed_here = landed_in[slot] - (taken_in[slot] or 0)
  if freed_here > 0 then
    landed(KEYS[2], KEYS[3], slot, freed_here)
    armed[#armed + 1] = slot
  else
    if freed_here < 0 then redis.call('HINCRBY', KEYS[2], slot, decimal(-freed_here)) end
    probe_ended(KEYS[3], slot)
  end
end
if #armed > 0 then arm_many(KEYS[4], KEYS[5], armed, now_ms(), false) end
for _, slot in ipairs(slots_taken) do
  if not landed_in[slot] then redis.call('HINCRBY', KEYS[2], slot, decimal(taken_in[slot])) end
end
return out
