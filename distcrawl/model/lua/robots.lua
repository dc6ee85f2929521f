-- robots.lua: record a slot's robots.txt Crawl-delay for the whole cluster.
--
-- KEYS[1] robots    HASH  slot -> Crawl-delay (ms); negative while robots.txt is being read
-- KEYS[2] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[3] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[4] limits    HASH  slot -> "<delay ms>:<concurrency>" set while the crawl runs
-- KEYS[5] throttle  HASH  slot -> adaptive delay (ms)
--
-- ARGV[1] slot
-- ARGV[2] Crawl-delay in ms, already capped (0 when robots.txt has none or was unreadable)
-- ARGV[3] 'fetched' when the caller just downloaded robots.txt itself: that download took
--         the slot's turn, so the request waiting for it gets the next turn, reserved
--         here; 'known' when the caller read robots.txt from Redis: the delay is recorded
--         only if nobody did yet
-- ARGV[4] the slot's delay from the caller's settings (ms)
--
-- Returns how many ms the caller's request must wait before it is sent.

local now = now_ms()
local slot, crawl_delay = ARGV[1], tonumber(ARGV[2])
local current = tonumber(redis.call('HGET', KEYS[1], slot))
if ARGV[3] == 'known' and current ~= nil and current >= 0 then
  return 0
end
redis.call('HSET', KEYS[1], slot, crawl_delay)
local wait = 0
if ARGV[3] == 'fetched' then
  local delay = tonumber(ARGV[4])
  local set = redis.call('HGET', KEYS[4], slot)
  if set then
    delay = tonumber(string.match(set, '^(%d*):')) or delay
  end
  delay = math.max(delay, crawl_delay, tonumber(redis.call('HGET', KEYS[5], slot)) or 0)
  if delay > 0 then
    local turn = math.max(now + delay, tonumber(redis.call('HGET', KEYS[2], slot)) or 0)
    redis.call('HSET', KEYS[2], slot, turn + delay)
    wait = turn - now
  end
end
redis.call('ZADD', KEYS[3], 'XX', 'LT', next_allowed(KEYS[2], slot, now), slot)
return wait
