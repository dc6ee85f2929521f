-- seen_set.lua: the default seen-set, a Redis SET of binary fingerprints. Not a script on
-- its own: distcrawl/model/lua/__init__.py prepends it to the scripts that need the seen-set
-- (commit.lua, seen.lua) and sets SEEN_KEYS, the index of its key in their KEYS, first.
--
-- KEYS[SEEN_KEYS]  seen  SET  binary fingerprints (12 bytes, see distcrawl/dupefilter.py)
--
-- Defines:
--   seen_add(fp)       1 if fp was new (it is now stored), 0 if it was already there
--   seen_has(fp)       1 if fp is stored, 0 otherwise; stores nothing
--   seen_prefetch(fps) reads whether each of fps is stored, in one call (SMISMEMBER); then
--                      seen_add of those answers from what was read and keeps the new ones
--                      back, until
--   seen_flush()       stores them in one call (SADD): a commit of many links costs two
--                      commands, not one per link. Nothing else may read the set between the
--                      two; a script that prefetches must flush before it returns.

local seen_known, seen_pending = {}, {}

local function seen_prefetch(fps)
  local flags = call_many('SMISMEMBER', KEYS[SEEN_KEYS], fps)
  for i, fp in ipairs(fps) do seen_known[fp] = flags[i] == 1 end
end

local function seen_add(fp)
  local known = seen_known[fp]
  if known == nil then return redis.call('SADD', KEYS[SEEN_KEYS], fp) end
  if known then return 0 end
  seen_known[fp] = true
  seen_pending[#seen_pending + 1] = fp
  return 1
end

local function seen_flush()
  call_many('SADD', KEYS[SEEN_KEYS], seen_pending)
  seen_pending = {}
end

local function seen_has(fp)
  return redis.call('SISMEMBER', KEYS[SEEN_KEYS], fp)
end
