-- doctor_ready.lua: put slots that have queued entries (requests, or due revisits) but are
-- missing from 'ready' back into it (distcrawl doctor --repair); without this their
-- requests are never leased.
--
-- KEYS[1] queue          ZSET  queue entries (see lib.lua), all scores 0
-- KEYS[2] ready          ZSET  slot -> when its next request may be leased (ms)
-- KEYS[3] slots          HASH  slot -> earliest time of its next request (ms)
-- KEYS[4] revisit_queue  ZSET  due revisits' queue entries, laid out as KEYS[1]
--
-- ARGV: the slots to check.
--
-- A slot is added only if it still has entries in either queue and is still missing (ZADD
-- NX), at its next allowed time (now, or later while its delay runs) so that its politeness
-- holds.
--
-- Returns how many slots were added.

local now = now_ms()
local added = 0
for _, slot in ipairs(ARGV) do
  local lo, hi = slot_range(slot)
  if redis.call('ZLEXCOUNT', KEYS[1], lo, hi) + redis.call('ZLEXCOUNT', KEYS[4], lo, hi) > 0 then
    local when = math.max(now, tonumber(redis.call('HGET', KEYS[3], slot)) or 0)
    added = added + redis.call('ZADD', KEYS[2], 'NX', when, slot)
  end
end
return added
