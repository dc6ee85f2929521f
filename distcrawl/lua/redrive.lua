-- redrive.lua: move dead letters back to work, each exactly once even if two operators
-- re-drive at the same time (a record is taken only if LREM still finds it).
--
-- KEYS[1] dead        LIST  dead-letter records (JSON)
-- KEYS[2] queue       ZSET  request id -> -priority
-- KEYS[3] requests    HASH  request id -> "<priority>:<payload>"
-- KEYS[4] seq         STRING counter for request ids
-- KEYS[5] start_urls  LIST  raw entries pushed by producers
--
-- ARGV: 4 arguments per record:
--   record    the dead-letter record, exactly as stored
--   kind      'q' back into the queue (the seen-set is not consulted: the request was seen),
--             'u' back into start_urls as a raw entry
--   priority  integer (for 'q')
--   payload   the encoded request ('q') or the raw entry ('u')
--
-- Returns how many records were re-driven.

local moved = 0
for i = 1, #ARGV, 4 do
  local record, kind, prio, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if redis.call('LREM', KEYS[1], 1, record) == 1 then
    if kind == 'q' then
      local id = string.format('%012x', redis.call('INCR', KEYS[4]))
      redis.call('ZADD', KEYS[2], -tonumber(prio), id)
      redis.call('HSET', KEYS[3], id, prio .. ':' .. payload)
    else
      redis.call('LPUSH', KEYS[5], payload)
    end
    moved = moved + 1
  end
end
return moved
