-- unclaim.lua: give claimed start_urls entries back to start_urls, at its consuming end
-- (the right), oldest claim last so that it is taken first, as if never claimed: the
-- claims of a worker that closes or pauses, and those of workers found dead.
--
-- KEYS[1]  start_urls LIST  raw entries pushed by producers
-- KEYS[2]  claimants  SET   worker tags whose claim list may hold entries
-- KEYS[3]  alive      ZSET  worker tag -> time of its last liveness beat (ms)
-- KEYS[4 ..]          the claim lists of the tags in ARGV[2 ..], in the same order
--
-- ARGV[1]  'own': give back unconditionally (the caller's own claims);
--          'orphans': only the claims of tags absent from alive (requeue.lua has removed
--          the tags whose beats lapsed), checked here again: a worker that was only stalled
--          and beats again keeps its claims and stores them itself
-- ARGV[2 ..] worker tags
--
-- A claim list given back is deleted and its tag leaves claimants. Each entry moves with one
-- LMOVE, O(1); the worker it came from, if it comes back, finds its claim list empty and its
-- commit skips the entry (commit.lua), so an entry is never stored twice.
--
-- Returns the number of entries given back.

local orphans_only = ARGV[1] == 'orphans'
if not orphans_only and ARGV[1] ~= 'own' then
  return redis.error_reply('distcrawl: invalid unclaim: mode')
end
local moved = 0
for i = 2, #ARGV do
  local tag, claims = ARGV[i], KEYS[i + 2]
  if not (orphans_only and redis.call('ZSCORE', KEYS[3], tag)) then
    while redis.call('LMOVE', claims, KEYS[1], 'LEFT', 'RIGHT') do
      moved = moved + 1
    end
    redis.call('SREM', KEYS[2], tag)
  end
end
return moved
