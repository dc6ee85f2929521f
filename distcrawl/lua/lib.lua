-- lib.lua: helpers shared by the frontier scripts; prepended to each of them when it is
-- registered, so that the layout of a queue entry is written down once. It touches no key
-- of its own: every function is given the keys it uses.
--
-- A queue entry (a member of the queue ZSET, all scores 0) is
--   <slot> "\0" <4-byte priority key> <6-byte sequence number> <payload>
-- so that ZRANGEBYLEX over "<slot>\0" returns one slot's requests best priority first,
-- first-in first-out within a priority. The priority key is 2^31 - priority, big-endian,
-- so that a higher priority sorts first. The 12 hex digits of the sequence number are
-- the request id used by leases, retries and acknowledgements.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function be_bytes(n, width)
  local out = {}
  for i = width, 1, -1 do
    out[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(out)
end

local function make_entry(slot, prio, seq, payload)
  prio = math.max(-2147483647, math.min(2147483647, tonumber(prio)))
  return slot .. '\0' .. be_bytes(2147483648 - prio, 4) .. be_bytes(seq, 6) .. payload
end

local function entry_slot(entry)
  return string.sub(entry, 1, string.find(entry, '\0', 1, true) - 1)
end

local function entry_id(entry)
  local at = string.find(entry, '\0', 1, true) + 5
  return string.format('%02x%02x%02x%02x%02x%02x', string.byte(entry, at, at + 5))
end

-- the lexicographic range of one slot's entries in the queue ZSET
local function slot_range(slot)
  return '[' .. slot .. '\0', '(' .. slot .. '\1'
end

local function next_allowed(slots, slot, now)
  return math.max(now, tonumber(redis.call('HGET', slots, slot)) or 0)
end

-- a slot whose requests may be leased again: ready at its next allowed time, moved
-- earlier when it was parked (at its concurrency limit), never later. 'add' when the slot
-- just got a request; otherwise only a slot already in 'ready' (one with queued requests)
-- is touched.
local function arm(ready, slots, slot, now, add)
  local when = next_allowed(slots, slot, now)
  if add then
    redis.call('ZADD', ready, 'LT', when, slot)
  else
    redis.call('ZADD', ready, 'XX', 'LT', when, slot)
  end
end

-- one request of this slot is no longer in flight. If the slot was waiting for its
-- robots.txt, that request was the one meant to read it and it ended without doing so
-- (dead-lettered, given back, expired): the next lease sends another.
local function landed(inflight, robots, slot)
  if redis.call('HINCRBY', inflight, slot, -1) <= 0 then
    redis.call('HDEL', inflight, slot)
  end
  local crawl_delay = tonumber(redis.call('HGET', robots, slot))
  if crawl_delay and crawl_delay < 0 then
    redis.call('HDEL', robots, slot)
  end
end

