-- finish.lua: decide, once for the whole crawl, that it is finished, and record the one
-- completion event of this run. A worker that ran dry (its last commit left it holding
-- nothing, the shared queue empty) calls it after reading the whole crawl (Shards.drained);
-- several may call it at once, or a call's reply may be lost and the call sent again: the
-- check and the transition are one script, so the event is added exactly once per run.
--
-- A run is the work numbered since the last finish: ``seq`` (request ids) moves on when new
-- requests are stored, so a crawl that finished and was given new work finishes again with
-- an event of its own; a finish with nothing numbered since the last changes nothing.
--
-- KEYS[1]  queue          ZSET   queue entries
-- KEYS[2]  revisit_queue  ZSET   due revisits' queue entries
-- KEYS[3]  leases         ZSET   request id -> lease deadline (ms)
-- KEYS[4]  delayed        ZSET   request id -> due time of a retry (ms)
-- KEYS[5]  revisits       ZSET   request id -> when the page is due again: a crawl with
--                                revisits scheduled is never finished
-- KEYS[6]  start_urls     LIST   raw entries pushed by producers
-- KEYS[7]  seq            STRING counter for request ids (the run's signature, one shard)
-- KEYS[8]  dead           LIST   dead-letter records (a crawl that only dead-lettered worked)
-- KEYS[9]  paused         STRING exists while the crawl is paused: never finished then
-- KEYS[10] stats          HASH   crawl-wide counters, copied into the event
-- KEYS[11] lifecycle      HASH   state ('running' | 'finished'), since (ms), seq (the
--                                finished run's signature), runs, event (its stream id),
--                                webhook (the event id while its webhook is not delivered)
-- KEYS[12] events         STREAM the crawl's events: one 'finished' entry per run
-- KEYS[13] runnable       LIST   the autoscaling mirror (runnable.lua): emptied on a finish,
--                                which nothing would refresh once the workers are gone
--
-- ARGV[1] work the caller found elsewhere (other shards' queued, leased and waiting work,
--         start URLs claimed and not stored yet): 0 to finish
-- ARGV[2] '' to read the run's signature from KEYS[7]; else the signature (a sharded
--         crawl: the sum of its shards' seq) and ARGV[3]
-- ARGV[3] '1' when the crawl ever had work (a sharded crawl's shards say), else ''
-- ARGV[4] the caller's worker tag, recorded in the event
-- ARGV[5] 1 when a webhook will be posted for the event (its delivery is then tracked)
-- ARGV[6] the events stream's approximate cap (XADD MAXLEN ~)
--
-- Returns {1, event id, run} when this call finished the crawl; {0, state} otherwise.

local state = redis.call('HGET', KEYS[11], 'state') or ''
if redis.call('EXISTS', KEYS[9]) == 1 then return {0, 'paused'} end
local work = tonumber(ARGV[1])
for i = 1, 5 do work = work + redis.call('ZCARD', KEYS[i]) end
work = work + redis.call('LLEN', KEYS[6])
local now = now_ms()
if work > 0 then
  if state == 'finished' then
    redis.call('HSET', KEYS[11], 'state', 'running', 'since', now)
    return {0, 'running'}
  end
  return {0, state}
end

local signature, worked = ARGV[2], ARGV[3] == '1'
if signature == '' then
  signature = redis.call('GET', KEYS[7]) or '0'
  worked = signature ~= '0' or redis.call('EXISTS', KEYS[8]) == 1
end
if not worked then return {0, state} end
if state == 'finished' then return {0, 'finished'} end
if redis.call('HGET', KEYS[11], 'seq') == signature then
  -- work came back (a start URL already seen, say) and went without numbering a request:
  -- the same run, finished again without a second event
  redis.call('HSET', KEYS[11], 'state', 'finished', 'since', now)
  redis.call('DEL', KEYS[13])
  return {0, 'finished'}
end

local run = redis.call('HINCRBY', KEYS[11], 'runs', 1)
local fields = {'event', 'finished', 'run', run, 'at', now, 'by', ARGV[4]}
local stats = redis.call('HGETALL', KEYS[10])
for i = 1, #stats, 2 do
  fields[#fields + 1] = 'stats.' .. stats[i]
  fields[#fields + 1] = stats[i + 1]
end
local id = redis.call('XADD', KEYS[12], 'MAXLEN', '~', tonumber(ARGV[6]), '*', unpack(fields))
redis.call('HSET', KEYS[11], 'state', 'finished', 'since', now, 'seq', signature, 'event', id)
-- nothing waits anywhere: nothing is runnable, and an autoscaler must not read the last count
redis.call('DEL', KEYS[13])
if ARGV[5] == '1' then redis.call('HSET', KEYS[11], 'webhook', id) end
return {1, id, run}
