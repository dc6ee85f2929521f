-- alive.lua: one liveness beat of a worker, stamped with the clock of the node holding the key.
--
-- KEYS[1] alive  ZSET  worker tag -> time of its last liveness beat (ms)
--
-- ARGV[1] the worker's tag (8 hex characters)
--
-- The score is this server's TIME, never the worker's clock: whoever judges the beat's age
-- (a reaper, ``distcrawl status``) reads the same server's TIME, so skewed hosts cannot make a
-- live worker look dead or a dead one look alive. Returns the score written.

local now = now_ms()
redis.call('ZADD', KEYS[1], now, ARGV[1])
return now
