-- renew.lua: extend the leases a live worker still holds.
--
-- KEYS[1] leases  ZSET  request id -> lease deadline (ms)
--
-- ARGV[1]     lease duration in milliseconds
-- ARGV[2 ..]  request ids
--
-- Only leases that still exist are extended (XX): one that expired and was requeued stays
-- requeued. Returns how many were extended.

local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', deadline, ARGV[i])
end
return renewed
