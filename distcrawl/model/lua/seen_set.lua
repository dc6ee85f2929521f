-- seen_set.lua: the default seen-set, a Redis SET of binary fingerprints. Not a script on
-- its own: distcrawl/model/lua/__init__.py prepends it to the scripts that need the seen-set
-- (commit.lua, seen.lua) and sets SEEN_KEYS, the index of its key in their KEYS, first.
--
-- KEYS[SEEN_KEYS]  seen  SET  binary fingerprints (12 bytes, see distcrawl/dupefilter.py)
--
-- Defines:
--   seen_add(fp)  1 if fp was new (it is now stored), 0 if it was already there
--   seen_has(fp)  1 if fp is stored, 0 otherwise; stores nothing

local function seen_add(fp)
  return redis.call('SADD', KEYS[SEEN_KEYS], fp)
end

local function seen_has(fp)
  return redis.call('SISMEMBER', KEYS[SEEN_KEYS], fp)
end
