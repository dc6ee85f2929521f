-- doctor_quarantine.lua: move queue (or revisit queue) members that cannot be parsed to the
-- dead letters (distcrawl doctor --repair). Each member moves only if ZREM still removes it,
-- so a member that a worker or a second doctor took meanwhile is not dead-lettered twice.
--
-- KEYS[1] members  ZSET  the queue or the revisit queue (entries as lib.lua lays them out)
-- KEYS[2] dead     LIST  dead-letter records (JSON), newest first
-- KEYS[3] stats    HASH  crawl-wide counters; 'quarantined' counts the members moved here
--
-- ARGV: 2 arguments per member:
--   member  the queue member, exactly as stored
--   record  its dead-letter record (JSON, built by distcrawl.model.frontier.dead_letter)
--
-- Returns how many members were moved.

local moved = 0
for i = 1, #ARGV, 2 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[i + 1])
    moved = moved + 1
  end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[3], 'quarantined', moved)
end
return moved
