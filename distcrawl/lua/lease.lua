-- lease.lua: take the best requests from the queue and lease them instead of deleting them.
-- A leased request stays in Redis until it is acknowledged; if its worker dies, the lease
-- expires and requeue.lua puts it back. Deadlines use the Redis server clock, so workers'
-- clocks do not matter.
--
-- KEYS[1] queue     ZSET  request id -> -priority (lowest score first, ties by id: FIFO)
-- KEYS[2] requests  HASH  request id -> "<priority>:<payload>"
-- KEYS[3] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[4] delayed   ZSET  request id -> due time (ms) of a retry
--
-- ARGV[1] how many requests to take at most
-- ARGV[2] lease duration in milliseconds
-- ARGV[3] how many due retries to move into the queue first, at most
--
-- Retries whose time has come join the queue at their priority before the take, so any
-- worker that asks for work also releases due retries: no clock process is needed.
--
-- Returns {queue length after the take, retries still waiting, retries released,
--          id1, value1, id2, value2, ...}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[4], id)
  local value = redis.call('HGET', KEYS[2], id)
  if value then
    redis.call('ZADD', KEYS[1], -tonumber(string.match(value, '^(-?%d+):')), id)
  end
end
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local out = {0, 0, #due}
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  for _, id in ipairs(ids) do
    local value = redis.call('HGET', KEYS[2], id)
    if value then
      redis.call('ZADD', KEYS[3], deadline, id)
      out[#out + 1] = id
      out[#out + 1] = value
    end
  end
end
out[1] = redis.call('ZCARD', KEYS[1])
out[2] = redis.call('ZCARD', KEYS[4])
return out
