-- requeue.lua: put leased requests back in the queue at their priority.
-- Used for expired leases (a worker died or stalled) and for the unstarted requests a
-- worker gives back when it closes.
--
-- KEYS[1] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[2] queue     ZSET  request id -> -priority
-- KEYS[3] requests  HASH  request id -> "<priority>:<payload>"
--
-- ARGV[1]     'expired' (leases whose deadline has passed) or 'ids' (the ids that follow)
-- ARGV[2]     at most this many leases (for 'expired')
-- ARGV[3 ..]  request ids (for 'ids')
--
-- Returns how many requests went back to the queue.

local ids
if ARGV[1] == 'expired' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
else
  ids = {}
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local requeued = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local value = redis.call('HGET', KEYS[3], id)
    if value then
      local prio = tonumber(string.match(value, '^(-?%d+):'))
      redis.call('ZADD', KEYS[2], -prio, id)
      requeued = requeued + 1
    end
  end
end
return requeued
