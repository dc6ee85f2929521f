-- sweep.lua: forget the politeness state of slots the crawl has finished with, a few at a
-- time, so that a broad crawl of millions of hosts does not keep every host's state forever.
--
-- KEYS[1] slots           HASH slot -> earliest time of its next request (ms)
-- KEYS[2] throttle_state  HASH slot -> adaptive concurrency cap and 429/503 share (commit.lua)
-- KEYS[3] robots          HASH slot -> robots.txt Crawl-delay (ms), negative while being read
--                              (read only: a slot being read is not finished)
-- KEYS[4] ready           ZSET slot -> when its next request may be leased: slots with queued work
-- KEYS[5] inflight        HASH slot -> requests leased and holding a place
-- KEYS[6] throttle        HASH slot -> adaptive delay (ms)
-- KEYS[7] throttle_raised HASH slot -> when its adaptive delay was last raised (ms)
-- KEYS[8] hungry          HASH slot -> when a worker last found it full below its share
-- KEYS[9] sweep           HASH scanned key name -> HSCAN cursor where the next sweep goes on
--
-- ARGV[1] slots looked at per scanned hash (HSCAN COUNT)
-- ARGV[2] grace (ms): a slot is finished once it has nothing queued (not in ready), nothing
--         in flight, and its next turn is this long past; the state of a host revisited
--         within the grace (its adaptive delay after 503s, say) is kept
--
-- The slots are found by scanning the HASHes that keep state per slot (slots, which
-- lease.lua stamps at every lease, and state) with cursors kept in KEYS[9]: each call costs
-- about ARGV[1] slots per HASH, never the number of hosts. Operator limits (distcrawl limit)
-- are kept: they are settings. So is the robots.txt Crawl-delay (KEYS[3], read only): a
-- worker that has parsed a host's robots.txt does not report it again, and a slot without
-- it would wait for a report that never comes.
-- Returns {slots forgotten, slots looked at, 1 when every scan came round to its start}.

local count, grace = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (count and count >= 1 and grace and grace >= 0) then
  return redis.error_reply('distcrawl: invalid sweep arguments')
end
local now = now_ms()
local forgotten, looked, wrapped = 0, 0, 1
local done = {}
for k = 1, 2 do
  local cursor = redis.call('HGET', KEYS[9], KEYS[k]) or '0'
  local page = redis.call('HSCAN', KEYS[k], cursor, 'COUNT', count)
  redis.call('HSET', KEYS[9], KEYS[k], page[1])
  if page[1] ~= '0' then wrapped = 0 end
  local fields = page[2]
  for i = 1, #fields, 2 do
    local slot = fields[i]
    if not done[slot] then
      done[slot] = true
      looked = looked + 1
      local next_at = tonumber(redis.call('HGET', KEYS[1], slot)) or 0
      local crawl_delay = tonumber(redis.call('HGET', KEYS[3], slot)) or 0
      if next_at + grace <= now and crawl_delay >= 0
          and not redis.call('ZSCORE', KEYS[4], slot)
          and redis.call('HEXISTS', KEYS[5], slot) == 0 then
        for j = 1, 2 do redis.call('HDEL', KEYS[j], slot) end
        for j = 6, 8 do redis.call('HDEL', KEYS[j], slot) end
        forgotten = forgotten + 1
      end
    end
  end
end
return {forgotten, looked, wrapped}
