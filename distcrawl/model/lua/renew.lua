-- renew.lua: extend the leases a live worker still holds.
--
-- KEYS[1] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[2] requests  HASH  request id -> record (token .. entry, see lib.lua)
--
-- ARGV[1]     lease duration in milliseconds
-- ARGV[2 ..]  pairs: request id, token
--
-- Only leases that still exist and still carry the caller's token are extended: one that
-- expired and was requeued stays requeued, one leased again by another worker stays theirs.
-- Returns how many were extended.

local deadline = now_ms() + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV, 2 do
  local record = redis.call('HGET', KEYS[2], ARGV[i])
  if record and string.sub(record, 1, TOKEN_BYTES) == ARGV[i + 1] then
    renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', deadline, ARGV[i])
  end
end
return renewed
