-- claim.lua: a worker claims start_urls entries, each O(1), so that no two workers read the
-- same entry: they move from the consuming end of start_urls (its right: producers LPUSH)
-- to the head of the worker's own claim list, as LMOVE RIGHT LEFT would move them one by one
-- (LRANGE, LTRIM and LPUSH of the whole batch do it in three calls: a hundred LMOVEs cost
-- the script three times as long). An entry leaves the claim list only in the
-- commit that stores what was made of it (commit.lua), so a worker killed in between loses
-- nothing: its claims go back to start_urls when it is found dead (unclaim.lua).
--
-- KEYS[1] start_urls LIST raw entries pushed by producers
-- KEYS[2] claims     LIST this worker's claimed entries, newest at the head
-- KEYS[3] claimants  SET  worker tags whose claim list may hold entries
-- KEYS[4] wake_of    LIST this worker's own wake-up tokens (keys.py ``wake_of``)
--
-- ARGV[1] how many entries the worker wants
-- ARGV[2] the worker's tag (its member in claimants)
-- ARGV[3] '1' when a wait for work follows in the same batch (an idle worker's poll): a
--         claim then pushes a token to KEYS[4], which ends that wait at once
--
-- The worker claims only when every start entry it read before is stored, so whatever its
-- claim list holds then is not being worked on: entries left there past the pending cap, or
-- claimed by a call whose reply was lost. They are handed out again first, and only the
-- rest of the count is claimed anew.
--
-- Returns the entries, oldest first (the order they were pushed in).

local want = tonumber(ARGV[1])
if not want or want < 0 or ARGV[2] == '' then
  return redis.error_reply('distcrawl: invalid claim: count or tag')
end
local held = redis.call('LRANGE', KEYS[2], 0, -1)
local out = {}
for i = #held, 1, -1 do out[#out + 1] = held[i] end
local more = want - #held
if more > 0 then
  -- the last `more` entries, newest first; the oldest (the list's tail) goes first
  local taken = redis.call('LRANGE', KEYS[1], -more, -1)
  if #taken > 0 then
    redis.call('LTRIM', KEYS[1], 0, -#taken - 1)
    local chunk = {}
    for i = #taken, 1, -1 do
      out[#out + 1] = taken[i]
      chunk[#chunk + 1] = taken[i]
      if #chunk == 1000 or i == 1 then
        redis.call('LPUSH', KEYS[2], unpack(chunk))
        chunk = {}
      end
    end
  end
end
if #out > 0 then
  redis.call('SADD', KEYS[3], ARGV[2])
  if ARGV[3] == '1' then
    redis.call('LPUSH', KEYS[4], '1')
    redis.call('PEXPIRE', KEYS[4], 1000)
  end
end
return out
