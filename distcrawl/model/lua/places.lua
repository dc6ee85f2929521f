-- places.lua: a worker's report on the places of its leased requests in their slots.
--
-- Freed: these requests left the downloader (answered, or failed), so they are no longer at
-- the site, and their places are given back now, not when they are acknowledged. The
-- acknowledgement waits for the page's children and items to be stored (an item pipeline
-- batching its writes can take longer than the download); a slot whose places stayed taken
-- until then would see far fewer requests than its concurrency. The lease itself is kept
-- until the acknowledgement, so a worker dying now still loses nothing.
--
-- Taken: reserves (requests lease.lua handed out ahead, holding no place) that the worker
-- sent in the places of requests of the same slot that had left the downloader. It sends
-- first and reports after, which is safe: a freed place and the reserve that took it are
-- reported together (the freed ones first), so the count never dropped at the site and
-- never rises here above what the site sees.
--
-- KEYS[1] requests  HASH  request id -> record (token .. entry, see lib.lua)
-- KEYS[2] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[3] inflight  HASH  slot -> leased requests that hold a place
-- KEYS[4] robots    HASH  slot -> robots.txt Crawl-delay (ms), negative while being read
-- KEYS[5] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[6] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[7] placeless SET   ids of leased requests that hold no place
--
-- ARGV[1]  how many pairs of freed requests follow
-- ARGV[..] pairs: request id, lease token (freed, then taken)
--
-- Only a lease still held under the token counts: one that expired was requeued, which
-- settled its place already. Returns {places freed, places taken}.

local now = now_ms()
local out = {0, 0}
local freed = tonumber(ARGV[1])

local function held(id, token)
  local record = redis.call('HGET', KEYS[1], id)
  local slot = record and string.sub(record, 1, TOKEN_BYTES) == token
    and entry_slot(string.sub(record, TOKEN_BYTES + 1))
  if slot and redis.call('ZSCORE', KEYS[2], id) then return slot end
  return nil
end

for i = 2, 2 * freed, 2 do
  local slot = held(ARGV[i], ARGV[i + 1])
  if slot and redis.call('SADD', KEYS[7], ARGV[i]) == 1 then
    landed(KEYS[3], KEYS[4], slot)
    arm(KEYS[5], KEYS[6], slot, now, false)
    out[1] = out[1] + 1
  end
end
for i = 2 * freed + 2, #ARGV, 2 do
  local slot = held(ARGV[i], ARGV[i + 1])
  if slot and redis.call('SREM', KEYS[7], ARGV[i]) == 1 then
    redis.call('HINCRBY', KEYS[3], slot, 1)
    out[2] = out[2] + 1
  end
end
return out
