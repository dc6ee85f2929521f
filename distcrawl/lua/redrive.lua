-- redrive.lua: move dead letters back to work, each exactly once even if two operators
-- re-drive at the same time (a record is taken only if LREM still finds it).
--
-- KEYS[1] dead        LIST  dead-letter records (JSON)
-- KEYS[2] queue       ZSET  queue entries (see lib.lua), all scores 0
-- KEYS[3] seq         STRING counter for request ids
-- KEYS[4] start_urls  LIST  raw entries pushed by producers
-- KEYS[5] ready       ZSET  slot -> when its next request may be leased (ms)
-- KEYS[6] slots       HASH  slot -> earliest time of its next request (ms)
--
-- ARGV: 5 arguments per record:
--   record    the dead-letter record, exactly as stored
--   kind      'q' back into the queue (the seen-set is not consulted: the request was seen),
--             'u' back into start_urls as a raw entry
--   slot      politeness slot (for 'q')
--   priority  integer (for 'q')
--   payload   the encoded request ('q') or the raw entry ('u')
--
-- A 'q' record whose slot could not be one (lib.lua's bad_slot) stays where it is.
-- Returns how many records were re-driven.

local now = now_ms()
local moved = 0
for i = 1, #ARGV, 5 do
  local record, kind, slot, prio, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if (kind ~= 'q' or not bad_slot(slot)) and redis.call('LREM', KEYS[1], 1, record) == 1 then
    if kind == 'q' then
      redis.call('ZADD', KEYS[2], 0, make_entry(slot, prio, redis.call('INCR', KEYS[3]), payload))
      arm(KEYS[5], KEYS[6], slot, now, true)
    else
      redis.call('LPUSH', KEYS[4], payload)
    end
    moved = moved + 1
  end
end
return moved
