-- doctor_inflight.lua: compare 'inflight' with the leases it counts, and with ARGV[1] =
-- 'fix' rewrite it (distcrawl doctor). A count that is too high keeps a slot at its
-- concurrency limit for good; one too low lets it exceed the limit. Done in one script
-- because workers lease and acknowledge meanwhile: the counts must match one moment.
-- O(leases), which is small (workers x prefetch).
--
-- KEYS[1] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[2] requests  HASH  request id -> record (8-byte token, then the queue entry)
-- KEYS[3] inflight  HASH  slot -> requests leased, not yet fetched nor acknowledged
-- KEYS[4] placeless  SET   ids of leased requests whose response gave their place back
--
-- ARGV[1] 'check' (change nothing) or 'fix'
--
-- A lease without a record, or whose record holds no "\0", has no slot and is not counted;
-- nor is one in 'placeless'. An id in 'placeless' without a lease is left over (Redis lost or
-- rolled back data): with 'fix' it is removed, else a new lease of that id would never
-- count.
--
-- Returns {slot1, stored count1, leases counted1, slot2, ...} for every slot that
-- disagreed (stored counts are returned as stored, '' if absent).

local expected = {}
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
  local record = redis.call('HGET', KEYS[2], id)
  if record and redis.call('SISMEMBER', KEYS[4], id) == 0 then
    local cut = string.find(record, '\0', 9, true)
    if cut then
      local slot = string.sub(record, 9, cut - 1)
      expected[slot] = (expected[slot] or 0) + 1
    end
  end
end
local out = {}
local stored = redis.call('HGETALL', KEYS[3])
local seen = {}
for i = 1, #stored, 2 do
  local slot, value = stored[i], stored[i + 1]
  seen[slot] = true
  local want = expected[slot] or 0
  if tonumber(value) ~= want then
    out[#out + 1] = slot
    out[#out + 1] = value
    out[#out + 1] = want
    if ARGV[1] == 'fix' then
      if want > 0 then
        redis.call('HSET', KEYS[3], slot, want)
      else
        redis.call('HDEL', KEYS[3], slot)
      end
    end
  end
end
for slot, want in pairs(expected) do
  if not seen[slot] then
    out[#out + 1] = slot
    out[#out + 1] = ''
    out[#out + 1] = want
    if ARGV[1] == 'fix' then redis.call('HSET', KEYS[3], slot, want) end
  end
end
if ARGV[1] == 'fix' then
  for _, id in ipairs(redis.call('SMEMBERS', KEYS[4])) do
    if not redis.call('ZSCORE', KEYS[1], id) then redis.call('SREM', KEYS[4], id) end
  end
end
return out
