-- sent.lua: a worker sent requests of slots with a delay some time after it leased them
-- (its reactor was busy, its downloader full). Each such slot's next turn, reserved at the
-- lease as lease time + delay, moves back by that lag, so that the next request, from
-- whichever worker, follows the one actually sent by at least the delay. The report arrives
-- after the send, so the correction errs on the polite side.
--
-- KEYS[1] slots  HASH  slot -> earliest time of its next request (ms)
-- KEYS[2] ready  ZSET  slot -> when its next request may be leased (ms)
--
-- ARGV    pairs: slot, when its request was leased (ms, the lease script's clock)
--
-- Returns how many slots were moved.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local moved = 0
for i = 1, #ARGV, 2 do
  local slot, lag = ARGV[i], now - tonumber(ARGV[i + 1])
  local turn = tonumber(redis.call('HGET', KEYS[1], slot))
  if turn and lag > 0 then
    turn = turn + lag
    redis.call('HSET', KEYS[1], slot, turn)
    redis.call('ZADD', KEYS[2], 'XX', 'GT', turn, slot)
    moved = moved + 1
  end
end
return moved
