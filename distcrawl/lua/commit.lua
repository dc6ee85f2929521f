-- commit.lua: acknowledge finished leases, add new requests and dead letters, and apply
-- the politeness feedback of the responses, atomically, so that a request is acknowledged
-- in the same step that stores what its callback produced.
--
-- KEYS[1]  queue      ZSET   queue entries (see lib.lua), all scores 0
-- KEYS[2]  requests   HASH   request id -> queue entry, for leased and delayed requests
-- KEYS[3]  seen       SET    binary fingerprints (seen_set.lua; unused with the Bloom filter)
-- KEYS[4]  seq        STRING counter for request ids
-- KEYS[5]  leases     ZSET   request id -> lease deadline (ms)
-- KEYS[6]  start_urls LIST   raw entries pushed by producers
-- KEYS[7]  dead       LIST   dead-letter records (JSON)
-- KEYS[8]  delayed    ZSET   request id -> due time (ms)
-- KEYS[9]  ready      ZSET   slot -> when its next request may be leased (ms)
-- KEYS[10] slots      HASH   slot -> earliest time of its next request (ms)
-- KEYS[11] inflight   HASH   slot -> requests leased and not acknowledged
-- KEYS[12] throttle   HASH   slot -> adaptive delay (ms) from 429/503 answers and latency
-- KEYS[13] robots     HASH   slot -> robots.txt Crawl-delay (ms), negative while being read
-- KEYS[14] raised     HASH   slot -> when its adaptive delay was last raised (ms)
-- KEYS[15 ..]         the Bloom filter's keys with DISTCRAWL_SEEN = "bloom" (seen_bloom.lua)
--
-- distcrawl/lua/__init__.py prepends the seen-set snippet (seen_set.lua or seen_bloom.lua),
-- which defines seen_add(fp) and may end the script before anything is written.
--
-- ARGV[1]              pending cap (0 = none): past it new requests are dropped and
--                      start_urls entries are left in their list
-- ARGV[2]              requests at or above this priority are kept past the cap
-- ARGV[3]              throttle parameters "start_ms:max_ms:target_concurrency" (target
--                      0 = no latency-based delay, only 429/503 answers raise it)
-- ARGV[4]              number of acknowledged ids (A), then the A ids
-- then                 number of entries (N), then 6 arguments per entry:
--   kind     'r' request, 's' request made from a start_urls entry, 'x' start_urls entry that
--            goes to the dead letters, 'd' dead letter, 'l' request to retry later (never
--            filtered or dropped: it is a new attempt of a request already seen)
--   fp       fingerprint ('' = do not filter)
--   slot     politeness slot (host name, IP address or the request's download_slot)
--   priority integer
--   payload  encoded request, or the dead-letter record for 'x' and 'd'
--   raw      the start_urls entry for 's' and 'x' (removed with LREM; if another worker
--            removed it first the entry is skipped); the delay in ms for 'l'; '' otherwise
-- then                 number of feedback records (F), then 5 arguments per record:
--   slot, responses, summed latency (ms), throttled answers (429/503), Retry-After (ms)
--
-- Returns {enqueued, duplicates, dead, skipped, queue length, dropped, held back}, or
-- {'bloom', layers} from seen_bloom.lua, having written nothing.

local now = now_ms()
local cap, keep_prio = tonumber(ARGV[1]), tonumber(ARGV[2])
local t_start, t_max, t_target = string.match(ARGV[3], '^(%d+):(%d+):([%d.]+)$')
t_start, t_max, t_target = tonumber(t_start), tonumber(t_max), tonumber(t_target)

local acks = tonumber(ARGV[4])
for i = 5, acks + 4 do
  local id = ARGV[i]
  local leased = redis.call('ZREM', KEYS[5], id) == 1
  local entry = redis.call('HGET', KEYS[2], id)
  if entry then
    redis.call('HDEL', KEYS[2], id)
    -- a lease that expired was requeued: it is done now, so it must not run again
    redis.call('ZREM', KEYS[1], entry)
    if leased then
      local slot = entry_slot(entry)
      landed(KEYS[11], KEYS[13], slot)
      arm(KEYS[9], KEYS[10], slot, now, false)
    end
  end
end

local base = acks + 5
local n = tonumber(ARGV[base])
local pending = redis.call('ZCARD', KEYS[1])
local enqueued, duplicates, dead, skipped, dropped, held = 0, 0, 0, 0, 0, 0
for i = 0, n - 1 do
  local at = base + 1 + i * 6
  local kind, fp, slot, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local payload, raw = ARGV[at + 4], ARGV[at + 5]
  local full = cap > 0 and pending >= cap and tonumber(prio) < keep_prio
  if kind == 's' and full then
    held = held + 1
  elseif kind == 'r' and full then
    dropped = dropped + 1
  else
    local take = true
    if kind == 's' or kind == 'x' then
      take = redis.call('LREM', KEYS[6], -1, raw) == 1
      if not take then skipped = skipped + 1 end
    end
    if take then
      if kind == 'x' or kind == 'd' then
        redis.call('LPUSH', KEYS[7], payload)
        dead = dead + 1
      elseif kind == 'l' then
        local entry = make_entry(slot, prio, redis.call('INCR', KEYS[4]), payload)
        local id = entry_id(entry)
        redis.call('ZADD', KEYS[8], now + tonumber(raw), id)
        redis.call('HSET', KEYS[2], id, entry)
        enqueued = enqueued + 1
      elseif fp == '' or seen_add(fp) == 1 then
        local entry = make_entry(slot, prio, redis.call('INCR', KEYS[4]), payload)
        redis.call('ZADD', KEYS[1], 0, entry)
        arm(KEYS[9], KEYS[10], slot, now, true)
        pending = pending + 1
        enqueued = enqueued + 1
      else
        duplicates = duplicates + 1
      end
    end
  end
end

-- politeness feedback: 429/503 answers double a slot's adaptive delay (at least start_ms,
-- at least Retry-After, at most max_ms) and push its next request back; answers that are
-- fine bring it down again, gradually (AutoThrottle's rule when a target concurrency is
-- set, else by a quarter per answer). It doubles at most once per delay: the answers to
-- the requests that were already in flight when it was raised (a burst of 503s from many
-- workers) say nothing new, and compounding them would park the slot at max_ms.
local fb = base + 1 + n * 6
local records = tonumber(ARGV[fb])
for i = 0, records - 1 do
  local at = fb + 1 + i * 5
  local slot, count, latency = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local throttled, retry_after = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local old = tonumber(redis.call('HGET', KEYS[12], slot)) or 0
  local new = old
  if throttled > 0 then
    local raised = tonumber(redis.call('HGET', KEYS[14], slot)) or 0
    if now - raised >= old then
      new = math.min(math.max(old * 2, t_start), t_max)
      redis.call('HSET', KEYS[14], slot, now)
    end
    new = math.max(new, retry_after)
    local until_ = now + math.max(new, retry_after)
    if until_ > (tonumber(redis.call('HGET', KEYS[10], slot)) or 0) then
      redis.call('HSET', KEYS[10], slot, until_)
    end
    redis.call('ZADD', KEYS[9], 'XX', 'GT', until_, slot)
  elseif count > 0 then
    if t_target > 0 then
      local target = latency / count / t_target
      new = math.min(math.max(target, (old + target) / 2), t_max)
    else
      new = old * math.pow(0.75, count)
    end
  end
  new = math.floor(new)
  if new < 1 then
    redis.call('HDEL', KEYS[12], slot)
    redis.call('HDEL', KEYS[14], slot)
  elseif new ~= old then
    redis.call('HSET', KEYS[12], slot, new)
  end
end
return {enqueued, duplicates, dead, skipped, redis.call('ZCARD', KEYS[1]), dropped, held}
