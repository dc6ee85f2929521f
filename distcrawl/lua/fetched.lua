-- fetched.lua: these leased requests left the downloader (answered, or failed), so they
-- are no longer at the site: their places in their slots are given back now, not when they
-- are acknowledged. The acknowledgement waits for the page's children and items to be stored
-- (an item pipeline batching its writes can take longer than the download); a slot whose
-- places stayed taken until then would see far fewer requests than its concurrency. The
-- lease itself is kept until the acknowledgement, so a worker dying now still loses nothing.
--
-- KEYS[1] requests  HASH  request id -> record (token .. entry, see lib.lua)
-- KEYS[2] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[3] inflight  HASH  slot -> requests leased, not acknowledged and not yet fetched
-- KEYS[4] robots    HASH  slot -> robots.txt Crawl-delay (ms), negative while being read
-- KEYS[5] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[6] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[7] fetched   SET   ids of leased requests whose place was given back already
--
-- ARGV    pairs: request id, lease token
--
-- Only a lease still held under the token counts: one that expired was requeued, which gave
-- its place back already. Returns how many places were given back.

local now = now_ms()
local freed = 0
for i = 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local record = redis.call('HGET', KEYS[1], id)
  local slot = record and string.sub(record, 1, TOKEN_BYTES) == token
    and entry_slot(string.sub(record, TOKEN_BYTES + 1))
  if slot and redis.call('ZSCORE', KEYS[2], id) and redis.call('SADD', KEYS[7], id) == 1 then
    landed(KEYS[3], KEYS[4], slot)
    arm(KEYS[5], KEYS[6], slot, now, false)
    freed = freed + 1
  end
end
return freed
