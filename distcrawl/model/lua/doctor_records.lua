-- doctor_records.lua: repair request records that nothing refers to (distcrawl doctor
-- --repair): not leased, not waiting in 'delayed' nor 'revisits', and their entry is not in
-- the queue.
-- Such a request would never run again; it goes back to the queue (its slot to 'ready'),
-- or, when its entry cannot be parsed, to the dead letters, and the record is deleted.
--
-- KEYS[1] requests  HASH  request id -> record (8-byte token, then the queue entry)
-- KEYS[2] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[3] delayed   ZSET  request id -> due time (ms) of a retry
-- KEYS[4] queue     ZSET  queue entries (see lib.lua), all scores 0
-- KEYS[5] ready     ZSET  slot -> when its next request may be leased (ms)
-- KEYS[6] slots     HASH  slot -> earliest time of its next request (ms)
-- KEYS[7] dead      LIST  dead-letter records (JSON), newest first
-- KEYS[8] stats     HASH  crawl-wide counters ('quarantined')
-- KEYS[9] revisits  ZSET  request id -> when the page is due again (ms)
--
-- ARGV: 3 arguments per record:
--   id      the request id
--   record  the record as the doctor read it: nothing is done if it changed since
--   dead    '' to requeue the entry, else the dead-letter record (JSON) for an entry that
--           cannot be parsed (the doctor parses it; the layout is in lib.lua)
--
-- Returns {requeued, dead-lettered}.

local now = now_ms()
local requeued, dead = 0, 0
for i = 1, #ARGV, 3 do
  local id, record, letter = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local entry = string.sub(record, 9)
  if redis.call('HGET', KEYS[1], id) == record
    and not redis.call('ZSCORE', KEYS[2], id)
    and not redis.call('ZSCORE', KEYS[3], id)
    and not redis.call('ZSCORE', KEYS[9], id)
    and not redis.call('ZSCORE', KEYS[4], entry) then
    redis.call('HDEL', KEYS[1], id)
    if letter == '' then
      local slot = entry_slot(entry)
      redis.call('ZADD', KEYS[4], 0, entry)
      local when = math.max(now, tonumber(redis.call('HGET', KEYS[6], slot)) or 0)
      redis.call('ZADD', KEYS[5], 'NX', when, slot)
      requeued = requeued + 1
    else
      redis.call('LPUSH', KEYS[7], letter)
      redis.call('HINCRBY', KEYS[8], 'quarantined', 1)
      dead = dead + 1
    end
  end
end
return {requeued, dead}
