-- requeue.lua: put leased requests back in the queue.
-- Used for expired leases (a worker died or stalled), for the leases of workers whose
-- liveness beats stopped, and for the unstarted requests a worker gives back when it
-- pauses or closes. It also names the workers whose start_urls claims must go back.
--
-- KEYS[1] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[2] queue     ZSET  queue entries (see lib.lua), all scores 0
-- KEYS[3] requests  HASH  request id -> record (token .. entry, see lib.lua)
-- KEYS[4] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[5] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[6] inflight  HASH  slot -> requests leased, not yet fetched nor acknowledged
-- KEYS[7] robots    HASH  slot -> robots.txt Crawl-delay (ms), negative while being read
-- KEYS[8] alive     ZSET  worker tag (8 hex digits: a token's first 4 bytes) -> time of
--                         its last liveness beat (ms)
-- KEYS[9] commits   HASH  worker tag -> id of the last commit it ran
-- KEYS[10] placeless SET   ids of leased requests whose response gave their place back
--                         already (places.lua)
-- KEYS[11] claimants SET   worker tags whose claim list may hold start_urls entries
-- KEYS[12] wake     LIST  wake-up tokens for idle workers (lib.lua's wake_idle)
--
-- ARGV[1]     'expired': leases whose deadline has passed, then those of dead workers;
--             'ids': the leases given as pairs that follow, if their tokens match
-- ARGV[2]     at most this many leases (for 'expired'); for 'ids', 1 to wake parked
--             workers for what is requeued (a worker draining or closing gives its leases
--             to the others at once), 0 not to (a reserve returned in passing)
-- ARGV[3]     a worker is dead when its last beat is older than this (ms; for 'expired')
-- ARGV[4 ..]  pairs: request id, token (for 'ids')
--
-- An expired request, or one of a dead worker, keeps its record, its token marked expired
-- (lib.lua's expired_token), so that a late acknowledgement from a worker that was only
-- stalled can still take it out of the queue (commit.lua) instead of having it crawled
-- twice, while the record alone says the lease is no longer held; a given-back one is not
-- coming back, so its record is dropped. A dead worker's leases are found by the tag in
-- their tokens (the marked byte is not the tag's), among all leases (workers x prefetch of
-- them), only when some worker's beats have lapsed; live workers' leases are never
-- shortened.
--
-- A claimant (KEYS[11]) that is not in alive once the dead are removed has claims nobody
-- will store: a dead worker's, or one whose tag was removed by an earlier run that ended
-- before its claims went back. A script cannot build their claim lists' keys, so it names
-- those tags and the caller gives their claims back with unclaim.lua, which checks alive
-- again (only with 'expired').
--
-- Returns {requeued, leases without a record (removed), dead workers, leases of dead
-- workers requeued, {claimant tags not alive}}.

local now = now_ms()
local out = {0, 0, 0, 0, {}}

local function requeue(id, record, keep)
  redis.call('ZREM', KEYS[1], id)
  local entry = string.sub(record, TOKEN_BYTES + 1)
  if keep then
    redis.call('HSET', KEYS[3], id, expired_token(string.sub(record, 1, TOKEN_BYTES)) .. entry)
  else
    redis.call('HDEL', KEYS[3], id)
  end
  local slot = entry_slot(entry)
  if slot then
    redis.call('ZADD', KEYS[2], 0, entry)
    done_with(KEYS[10], KEYS[6], KEYS[7], slot, id)
    arm(KEYS[4], KEYS[5], slot, now, true)
  end
  out[1] = out[1] + 1
end

if ARGV[1] == 'expired' then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  for _, id in ipairs(ids) do
    local record = redis.call('HGET', KEYS[3], id)
    if record then
      requeue(id, record, true)
    else
      redis.call('ZREM', KEYS[1], id)
      redis.call('SREM', KEYS[10], id)
      out[2] = out[2] + 1
    end
  end
  local dead = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 100)
  if #dead > 0 then
    local gone = {}
    for _, tag in ipairs(dead) do
      gone[tag] = true
      redis.call('ZREM', KEYS[8], tag)
      redis.call('HDEL', KEYS[9], tag)
    end
    out[3] = #dead
    for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
      local record = redis.call('HGET', KEYS[3], id)
      if record and gone[to_hex(string.sub(record, 1, 4))] then
        requeue(id, record, true)
        out[4] = out[4] + 1
      end
    end
  end
  -- one ZMSCORE for every claimant (parked workers are claimants while they wait)
  local claimants = redis.call('SMEMBERS', KEYS[11])
  if #claimants > 0 then
    local scores = redis.call('ZMSCORE', KEYS[8], unpack(claimants))
    for i, tag in ipairs(claimants) do
      if not scores[i] then out[5][#out[5] + 1] = tag end
    end
  end
else
  for i = 4, #ARGV, 2 do
    local id, token = ARGV[i], ARGV[i + 1]
    local record = redis.call('HGET', KEYS[3], id)
    -- the record under the token is the lease still held (lib.lua): no ZSCORE of it
    if record and string.sub(record, 1, TOKEN_BYTES) == token then
      requeue(id, record, false)
    end
  end
  if ARGV[2] == '1' then wake_idle(KEYS[12], out[1]) end
end
return out
