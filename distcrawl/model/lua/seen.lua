-- seen.lua: check or add fingerprints in the seen-set without queueing anything, with the
-- same code commit.lua uses (the seen-set snippet, seen_set.lua or seen_bloom.lua, is
-- prepended by distcrawl/model/lua/__init__.py with SEEN_KEYS = 1). For importing URLs already
-- crawled elsewhere, and for measuring the seen-set.
--
-- KEYS[1 ..]  the seen-set's keys (see the snippet)
--
-- ARGV[1]      'add' (seen_add) or 'has' (seen_has)
-- ARGV[2 ..]   fingerprints
--
-- Returns one 1 or 0 per fingerprint: new / not seen (1) or seen (0) for 'add', seen (1)
-- or not (0) for 'has'.

local check = seen_has
if ARGV[1] == 'add' then check = seen_add end
local out = {}
for i = 2, #ARGV do out[i - 1] = check(ARGV[i]) end
return out
