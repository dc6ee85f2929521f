-- claimed.lua: take stored start_urls entries out of a worker's claim list, once the shards
-- that store what was made of them said so (DISTCRAWL_SHARDS above 1: commit.lua runs in a
-- shard and cannot reach the crawl's claim lists, so this is the step after it). An entry
-- no longer there (the worker was taken for dead and its claims went back to start_urls) is
-- skipped; another worker stores it again, deduplicated by its shard's seen-set.
--
-- KEYS[1]  claims     LIST  the worker's claimed start_urls entries (claim.lua)
-- KEYS[2]  claimants  SET   worker tags whose claim list may hold entries: the worker's
--                           leaves it once its claim list is empty
--
-- ARGV[1]     the worker's tag
-- ARGV[2 ..]  raw entries stored
--
-- Returns how many entries were taken out.

local removed = 0
for i = 2, #ARGV do
  removed = removed + redis.call('LREM', KEYS[1], -1, ARGV[i])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], ARGV[1])
end
return removed
