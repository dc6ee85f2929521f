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
--
-- A request record (the 'requests' HASH, id -> record) is an 8-byte token followed by the
-- queue entry. A lease's token is the holder's 4-byte worker tag and 4 bytes that differ
-- from lease to lease; acknowledgements, renewals and give-backs must present it, so a late
-- or replayed one, or one whose id was reused after Redis lost data, matches nothing. A
-- retry waiting in 'delayed' has the token NO_TOKEN.
--
-- A lease that expired, or whose worker died, keeps its record (requeue.lua) with the
-- token's fifth byte moved by 128 (expired_token): a late acknowledgement still finds its
-- request and takes it back out of the queue, and a record whose token is the one presented
-- is a lease still held, so that an acknowledgement or a place report reads the record
-- alone, not the lease too.
--
-- Entries come from producers and from a Redis that others may write to: every script that
-- reads one checks its layout (entry_slot returns nil) before using it.

local TOKEN_BYTES = 8
local NO_TOKEN = string.rep('\0', TOKEN_BYTES)
local MAX_SLOT_BYTES = 255
local DEAD_RAW_BYTES = 65536

-- the token the record of an expired lease keeps instead of ``token`` (see above); nil for
-- something that is no token
local function expired_token(token)
  if #token ~= TOKEN_BYTES then return nil end
  return string.sub(token, 1, 4) .. string.char((string.byte(token, 5) + 128) % 256)
    .. string.sub(token, 6)
end

-- at most this many arguments go into one variadic call (unpack's C stack is ~8,000); even,
-- so that the pairs of HSET and ZADD stay whole
local CALL_CHUNK = 1000

-- ``command`` on ``key`` with ``items`` as its arguments, sent in calls of at most
-- CALL_CHUNK: one call for what a per-item loop would send as many. The replies of a command
-- answering per item (HMGET, ZMSCORE, SMISMEMBER) are joined in order; an integer reply
-- (SADD, SREM, HDEL, ZREM) is summed.
local function call_many(command, key, items)
  local joined, sum = {}, 0
  for first = 1, #items, CALL_CHUNK do
    local last = math.min(#items, first + CALL_CHUNK - 1)
    local reply = redis.call(command, key, unpack(items, first, last))
    if type(reply) == 'table' then
      for i = 1, #reply do joined[#joined + 1] = reply[i] end
    else
      sum = sum + reply
    end
  end
  return joined, sum
end

-- ``n`` (an integer) as the decimal string Redis reads it from: a number given to redis.call
-- is formatted there with %.17g (glibc's float formatting, several times string.format's
-- integer one), so the scripts' hot calls pass strings
local function decimal(n)
  return string.format('%d', n)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- the priority key and the sequence number in one struct.pack: a commit makes one entry a
-- request it queues, and struct.pack is a third of the Lua time a request of the loops of
-- arithmetic and string.char it replaced
local function make_entry(slot, prio, seq, payload)
  prio = math.max(-2147483647, math.min(2147483647, tonumber(prio)))
  return slot .. '\0' .. struct.pack('>I4I6', 2147483648 - prio, seq) .. payload
end

-- the slot of a well-formed entry, nil for one that is not: no NUL, or too short to hold
-- the priority and the sequence number. ``first``: where the entry starts in ``text`` (a
-- request record is token .. entry: TOKEN_BYTES + 1), so that a record read per
-- acknowledged or reported request is not copied into an entry first, a string the size of
-- the request made and dropped for one check
local function entry_slot(text, first)
  first = first or 1
  local cut = string.find(text, '\0', first, true)
  if not cut or #text < cut + 10 then return nil end
  return string.sub(text, first, cut - 1)
end

-- the id of a well-formed entry (entry_slot did not return nil); ``cut``: where its slot
-- ends, when the caller knows it (a string.find less a request)
local function entry_id(entry, cut)
  local at = (cut or string.find(entry, '\0', 1, true)) + 5
  local b1, b2, b3, b4, b5, b6 = string.byte(entry, at, at + 5)
  return string.format('%012x', ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6)
end

-- priority and payload of a well-formed entry, to store it again under a new id
local function entry_fields(entry)
  local cut = string.find(entry, '\0', 1, true)
  local b1, b2, b3, b4 = string.byte(entry, cut + 1, cut + 4)
  local prio = 2147483648 - (((b1 * 256 + b2) * 256 + b3) * 256 + b4)
  return prio, string.sub(entry, cut + 11)
end

-- why a slot given to a script cannot be one, or nil
local function bad_slot(slot)
  if slot == '' then return 'empty slot' end
  if #slot > MAX_SLOT_BYTES then return 'slot over ' .. MAX_SLOT_BYTES .. ' bytes' end
  if string.find(slot, '\0', 1, true) then return 'slot contains NUL' end
  return nil
end

local function to_hex(bytes)
  return (string.gsub(bytes, '.', function(c) return string.format('%02x', string.byte(c)) end))
end

-- move a queue member that cannot be a request to the dead letters, with its bytes (the
-- first DEAD_RAW_BYTES, in hex), their full length and SHA1, and count it
local function quarantine(dead, stats, raw, reason, now)
  local record = cjson.encode({
    reason = reason,
    source = 'queue',
    raw_hex = to_hex(string.sub(raw, 1, DEAD_RAW_BYTES)),
    raw_length = #raw,
    raw_sha1 = redis.sha1hex(raw),
    truncated = #raw > DEAD_RAW_BYTES,
    worker = 'redis',
    time = now / 1000,
  })
  redis.call('LPUSH', dead, record)
  redis.call('HINCRBY', stats, 'quarantined', 1)
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
    redis.call('ZADD', ready, 'LT', decimal(when), slot)
  else
    redis.call('ZADD', ready, 'XX', 'LT', decimal(when), slot)
  end
end

-- arm() for each of ``list`` (distinct slots): their next allowed times read with one HMGET
-- and set with one ZADD (per CALL_CHUNK arguments), not two calls a slot
local function arm_many(ready, slots, list, now, add)
  if #list == 0 then return end
  local at = call_many('HMGET', slots, list)
  local pairs_ = {}
  for i, slot in ipairs(list) do
    pairs_[#pairs_ + 1] = decimal(math.max(now, tonumber(at[i]) or 0))
    pairs_[#pairs_ + 1] = slot
  end
  for first = 1, #pairs_, CALL_CHUNK do
    local last = math.min(#pairs_, first + CALL_CHUNK - 1)
    if add then
      redis.call('ZADD', ready, 'LT', unpack(pairs_, first, last))
    else
      redis.call('ZADD', ready, 'XX', 'LT', unpack(pairs_, first, last))
    end
  end
end

-- a request of this slot left the downloader or ended: if the slot was waiting for its
-- robots.txt, that request was the one meant to read it and it ended without doing so
-- (dead-lettered, given back, expired), so the next lease sends another
local function probe_ended(robots, slot)
  local crawl_delay = tonumber(redis.call('HGET', robots, slot))
  if crawl_delay and crawl_delay < 0 then
    redis.call('HDEL', robots, slot)
  end
end

-- ``count`` requests of this slot (1 when nil) are no longer in flight
local function landed(inflight, robots, slot, count)
  if redis.call('HINCRBY', inflight, slot, decimal(-(count or 1))) <= 0 then
    redis.call('HDEL', inflight, slot)
  end
  probe_ended(robots, slot)
end

-- a leased request ends (acknowledged, requeued, given back): its place in the slot is
-- given back unless it holds none (it left the downloader and gave it back then, or it is a
-- reserve: places.lua), so that a place is freed exactly once
local function done_with(placeless, inflight, robots, slot, id)
  if redis.call('SREM', placeless, id) == 0 then landed(inflight, robots, slot) end
end

-- wake-up tokens for idle workers (each waits in BLPOP on ``wake``, idle.py): one token per
-- request queued, at most WAKE_MAX waiting at a time, each for at most WAKE_TTL_MS, so a
-- token nobody takes soon is gone. Every script that queues requests a parked worker would
-- not otherwise hear of pushes them (commit.lua, redrive.lua; frontier.py's wake_ops for
-- requests requeued or committed in shards)
local WAKE_MAX, WAKE_TTL_MS = 16, 1000
local function wake_idle(wake, queued)
  if queued <= 0 then return end
  local room = WAKE_MAX - redis.call('LLEN', wake)
  if room > 0 then
    local tokens = {}
    for i = 1, math.min(queued, room) do tokens[i] = '1' end
    redis.call('LPUSH', wake, unpack(tokens))
    redis.call('PEXPIRE', wake, WAKE_TTL_MS)
  end
end
