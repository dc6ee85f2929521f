-- requeue.lua: put leased requests back in the queue.
-- Used for expired leases (a worker died or stalled) and for the unstarted requests a
-- worker gives back when it pauses or closes.
--
-- KEYS[1] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[2] queue     ZSET  queue entries (see lib.lua), all scores 0
-- KEYS[3] requests  HASH  request id -> queue entry, for leased and delayed requests
-- KEYS[4] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[5] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[6] inflight  HASH  slot -> requests leased and not acknowledged
-- KEYS[7] robots    HASH  slot -> robots.txt Crawl-delay (ms), negative while being read
--
-- ARGV[1]     'expired' (leases whose deadline has passed) or 'ids' (the ids that follow)
-- ARGV[2]     at most this many leases (for 'expired')
-- ARGV[3 ..]  request ids (for 'ids')
--
-- An expired request keeps its entry in 'requests', so that a late acknowledgement from
-- the stalled worker can still take it out of the queue (commit.lua) instead of having it
-- crawled twice; a released one is not coming back, so its entry is dropped.
--
-- Returns how many requests went back to the queue.

local now = now_ms()
local ids
local expired = ARGV[1] == 'expired'
if expired then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
else
  ids = {}
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local requeued = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local entry = redis.call('HGET', KEYS[3], id)
    if entry then
      if not expired then redis.call('HDEL', KEYS[3], id) end
      local slot = entry_slot(entry)
      redis.call('ZADD', KEYS[2], 0, entry)
      landed(KEYS[6], KEYS[7], slot)
      arm(KEYS[4], KEYS[5], slot, now, true)
      requeued = requeued + 1
    end
  end
end
return requeued
