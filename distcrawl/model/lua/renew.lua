-- renew.lua: extend the leases a live worker still holds.
--
-- KEYS[1] leases    ZSET  request id -> lease deadline (ms)
-- KEYS[2] requests  HASH  request id -> record (token .. entry, see lib.lua)
--
-- ARGV[1]     lease duration in milliseconds
-- ARGV[2 ..]  pairs: request id, token
--
-- Only leases that still exist and still carry the caller's token are extended: one that
-- expired and was requeued stays requeued, one leased again by another worker stays theirs.
-- Returns how many were extended.

local deadline = now_ms() + tonumber(ARGV[1])
-- every record read with one HMGET and every deadline moved with one ZADD, however many
-- leases the worker holds
local ids = {}
for i = 2, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
local records = call_many('HMGET', KEYS[2], ids)
local moves = {}
for n, id in ipairs(ids) do
  local record = records[n]
  if record and string.sub(record, 1, TOKEN_BYTES) == ARGV[2 * n + 1] then
    moves[#moves + 1] = deadline
    moves[#moves + 1] = id
  end
end
-- the flags go with every call; CALL_CHUNK is even, so each call's pairs stay whole
local renewed = 0
for first = 1, #moves, CALL_CHUNK do
  local last = math.min(#moves, first + CALL_CHUNK - 1)
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', unpack(moves, first, last))
end
return renewed
