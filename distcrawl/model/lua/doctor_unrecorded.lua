-- doctor_unrecorded.lua: remove request ids without a record from 'leases' or 'delayed'
-- (distcrawl doctor --repair). Such an id names nothing that could be requeued or retried;
-- a lease of one would stay forever and an expired one is skipped by requeue.lua.
--
-- KEYS[1] ids       ZSET  'leases' (id -> lease deadline) or 'delayed' (id -> due time)
-- KEYS[2] requests  HASH  request id -> record (8-byte token, then the queue entry)
--
-- ARGV: the request ids. Each is removed only if it still has no record.
--
-- Returns how many ids were removed.

local removed = 0
for _, id in ipairs(ARGV) do
  if redis.call('HEXISTS', KEYS[2], id) == 0 then
    removed = removed + redis.call('ZREM', KEYS[1], id)
  end
end
return removed
