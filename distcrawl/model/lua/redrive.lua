-- redrive.lua: move one page of dead letters back to work, each exactly once even if two
-- operators re-drive at the same time, in time bounded by the page, not the whole list.
--
-- KEYS[1] dead        LIST  dead-letter records (JSON), newest first (workers LPUSH)
-- KEYS[2] queue       ZSET  queue entries (see lib.lua), all scores 0
-- KEYS[3] seq         STRING counter for request ids
-- KEYS[4] start_urls  LIST  raw entries pushed by producers
-- KEYS[5] ready       ZSET  slot -> when its next request may be leased (ms)
-- KEYS[6] slots       HASH  slot -> earliest time of its next request (ms)
-- KEYS[7] wake        LIST  wake-up tokens for idle workers (lib.lua's wake_idle): a
--                           parked worker hears of requests re-driven into the queue at once
--
-- ARGV: 6 arguments per record:
--   at        where the operator read it: a negative index, counted from the oldest end,
--             which new dead letters (pushed at the other end) do not move; 0 = unknown
--   record    the dead-letter record, exactly as stored
--   kind      'q' back into the queue (the seen-set is not consulted: the request was seen),
--             'u' back into start_urls as a raw entry
--   slot      politeness slot (for 'q')
--   priority  integer (for 'q')
--   payload   the encoded request ('q') or the raw entry ('u')
--
-- A record still at its index is blanked there (LSET, no scan) and the blanks are removed at
-- the end with one LREM from the oldest end, which stops at the last blank: the page's
-- records sit near that end, so the cost is the page's distance from it, not the list's
-- length. A record that moved (another operator took or purged records) is looked up by
-- value instead; one that is gone was taken by someone else and is skipped. Dead-letter
-- records are JSON, never empty, so the blank cannot be mistaken for one.
-- A 'q' record whose slot could not be one (lib.lua's bad_slot) stays where it is.
-- Returns how many records were re-driven.

local BLANK = ''
local now = now_ms()
local moved, blanks, queued = 0, 0, 0
for i = 1, #ARGV, 6 do
  local at, record, kind = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
  local slot, prio, payload = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if not at or at > 0 or record == BLANK then
    return redis.error_reply('distcrawl: invalid redrive record ' .. ((i + 5) / 6))
  end
  local take = false
  if kind ~= 'q' or not bad_slot(slot) then
    if at < 0 and redis.call('LINDEX', KEYS[1], at) == record then
      redis.call('LSET', KEYS[1], at, BLANK)
      blanks = blanks + 1
      take = true
    else
      take = redis.call('LREM', KEYS[1], 1, record) == 1
    end
  end
  if take then
    if kind == 'q' then
      redis.call('ZADD', KEYS[2], 0, make_entry(slot, prio, redis.call('INCR', KEYS[3]), payload))
      arm(KEYS[5], KEYS[6], slot, now, true)
      queued = queued + 1
    else
      redis.call('LPUSH', KEYS[4], payload)
    end
    moved = moved + 1
  end
end
if blanks > 0 then
  redis.call('LREM', KEYS[1], -blanks, BLANK)
end
wake_idle(KEYS[7], queued)
return moved
