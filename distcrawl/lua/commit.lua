-- commit.lua: acknowledge finished leases and add new requests and dead letters, atomically,
-- so that a request is acknowledged in the same step that stores what its callback produced.
--
-- KEYS[1] queue      ZSET  request id -> -priority
-- KEYS[2] requests   HASH  request id -> "<priority>:<payload>"
-- KEYS[3] seen       SET   binary fingerprints (used by seen_set.lua; unused with the Bloom filter)
-- KEYS[4] seq        STRING counter for request ids
-- KEYS[5] leases     ZSET  request id -> lease deadline (ms)
-- KEYS[6] start_urls LIST  raw entries pushed by producers
-- KEYS[7] dead       LIST  dead-letter records (JSON)
-- KEYS[8] delayed    ZSET  request id -> due time (ms)
-- KEYS[9 ..]         the Bloom filter's keys with DISTCRAWL_SEEN = "bloom" (see seen_bloom.lua)
--
-- distcrawl/lua/__init__.py prepends the seen-set snippet (seen_set.lua or seen_bloom.lua),
-- which defines seen_add(fp) and may end the script before anything is written.
--
-- ARGV[1]              number of acknowledged ids (A)
-- ARGV[2 .. A+1]       the acknowledged request ids
-- ARGV[A+2]            number of entries (N), then 5 arguments per entry:
--   kind     'r' request, 's' request made from a start_urls entry, 'x' start_urls entry that
--            goes to the dead letters, 'd' dead letter, 'l' request to retry later (never
--            filtered: it is a new attempt of a request already seen)
--   fp       fingerprint ('' = do not filter)
--   priority integer
--   payload  encoded request, or the dead-letter record for 'x' and 'd'
--   raw      the start_urls entry for 's' and 'x' (removed with LREM; if another worker
--            removed it first the entry is skipped); the delay in ms for 'l'; '' otherwise
--
-- Returns {enqueued, duplicates, dead, skipped, queue length}, or {'bloom', layers} from
-- seen_bloom.lua, having written nothing.

local acks = tonumber(ARGV[1])
if acks > 0 then
  local ids = {}
  for i = 2, acks + 1 do ids[#ids + 1] = ARGV[i] end
  for i = 1, #ids, 1000 do
    local chunk = {unpack(ids, i, math.min(i + 999, #ids))}
    redis.call('ZREM', KEYS[5], unpack(chunk))
    redis.call('HDEL', KEYS[2], unpack(chunk))
    redis.call('ZREM', KEYS[1], unpack(chunk))
  end
end

local base = acks + 2
local n = tonumber(ARGV[base])
local enqueued, duplicates, dead, skipped = 0, 0, 0, 0
local now = nil
for i = 0, n - 1 do
  local at = base + 1 + i * 5
  local kind, fp, prio, payload, raw = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  local take = true
  if kind == 's' or kind == 'x' then
    take = redis.call('LREM', KEYS[6], -1, raw) == 1
    if not take then skipped = skipped + 1 end
  end
  if take then
    if kind == 'x' or kind == 'd' then
      redis.call('LPUSH', KEYS[7], payload)
      dead = dead + 1
    elseif kind == 'l' then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local id = string.format('%012x', redis.call('INCR', KEYS[4]))
      redis.call('ZADD', KEYS[8], now + tonumber(raw), id)
      redis.call('HSET', KEYS[2], id, prio .. ':' .. payload)
      enqueued = enqueued + 1
    elseif fp == '' or seen_add(fp) == 1 then
      local id = string.format('%012x', redis.call('INCR', KEYS[4]))
      redis.call('ZADD', KEYS[1], -tonumber(prio), id)
      redis.call('HSET', KEYS[2], id, prio .. ':' .. payload)
      enqueued = enqueued + 1
    else
      duplicates = duplicates + 1
    end
  end
end
return {enqueued, duplicates, dead, skipped, redis.call('ZCARD', KEYS[1])}
