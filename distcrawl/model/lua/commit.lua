-- commit.lua: acknowledge finished leases, add new requests and dead letters, and apply
-- the politeness feedback of the responses, atomically, so that a request is acknowledged
-- in the same step that stores the last of what its callback produced.
--
-- KEYS[1]  queue           ZSET   queue entries (see lib.lua), all scores 0
-- KEYS[2]  requests        HASH   request id -> record (token .. entry, see lib.lua)
-- KEYS[3]  seen            SET    binary fingerprints (seen_set.lua; unused with the Bloom filter)
-- KEYS[4]  seq             STRING counter for request ids
-- KEYS[5]  leases          ZSET   request id -> lease deadline (ms)
-- KEYS[6]  claims          LIST   the committing worker's claimed start_urls entries (claim.lua)
-- KEYS[7]  dead            LIST   dead-letter records (JSON)
-- KEYS[8]  delayed         ZSET   request id -> due time (ms)
-- KEYS[9]  ready           ZSET   slot -> when its next request may be leased (ms)
-- KEYS[10] slots           HASH   slot -> earliest time of its next request (ms)
-- KEYS[11] inflight        HASH   slot -> requests leased, not yet fetched nor acknowledged
-- KEYS[12] throttle        HASH   slot -> adaptive delay (ms) from 429/503 answers and latency
-- KEYS[13] robots          HASH   slot -> robots.txt Crawl-delay (ms), negative while being read
-- KEYS[14] throttle_raised HASH   slot -> when its adaptive delay was last raised (ms)
-- KEYS[15] commits         HASH   worker tag -> id of the last commit it ran
-- KEYS[16] throttle_state  HASH   slot -> "<cap>:<share>:<hold>": adaptive concurrency cap (0 =
--                                 none), share of 429/503 among its recent answers, answers to
--                                 wait for before the cap is cut again (see the feedback section)
-- KEYS[17] placeless       SET    ids of leased requests whose response gave their place back
--                                 already (places.lua)
-- KEYS[18] claimants       SET    worker tags whose claim list may hold entries: the committing
--                                 worker's leaves it when its claim list empties
-- KEYS[19] wake            LIST   wake-up tokens: idle workers wait on it (BLPOP, idle.py); a
--                                 commit that queues requests pushes some (lib.lua wake_idle):
--                                 few and short-lived
-- KEYS[20] revisits       ZSET   request id -> when the page is due again (ms)
-- KEYS[21] revisit_of     HASH   binary fingerprint -> id of the page's revisit in KEYS[20]
-- KEYS[22] legacy_seen     SET    fingerprints of another crawler (scrapy-redis) of the pages it
--                                 crawled before this crawl took over (distcrawl import), read
--                                 only for the 'r' entries that carry one in 'raw'
-- KEYS[23 ..]         the Bloom filter's keys with DISTCRAWL_SEEN = "bloom" (seen_bloom.lua)
--
-- distcrawl/model/lua/__init__.py prepends the seen-set snippet (seen_set.lua or seen_bloom.lua),
-- which defines seen_add(fp) and may end the script before anything is written.
--
-- ARGV[1]              "<pending cap>:<per-slot cap>" (0 = none). Past the pending cap new
--                      requests are dropped and start_urls entries stay in the claim list
--                      (claim.lua hands them out again at the worker's next claim). Past
--                      the per-slot cap (requests queued in the request's slot) new
--                      requests of that slot are dropped: one host that makes up links
--                      without end (a calendar, a session id in every URL) cannot fill the
--                      frontier. Start URLs are not held at the per-slot cap: an operator
--                      put them there.
-- ARGV[2]              requests at or above this priority are kept past the cap
-- ARGV[3]              throttle parameters "start_ms:max_ms:target:window:share": the first
--                      and the longest adaptive delay; AutoThrottle's target concurrency (0 =
--                      no latency-based delay, only 429/503 answers raise it); how many
--                      answers the throttled share is averaged over; the share above which a
--                      slot is overloaded
-- ARGV[4]              the committing worker's tag ('' = none: no replay protection)
-- ARGV[5]              commit id ('' = none): a commit whose id is the last one this worker
--                      ran is a replay (its reply was lost) and changes nothing
-- ARGV[6]              '1' to return the positions of the entries not stored, for
--                      request_dropped and DUPEFILTER_DEBUG: p (from 0) for a duplicate,
--                      -p - 1 for a request dropped at the cap
-- ARGV[7]              number of acknowledgements (A), then A pairs: request id, token
-- then                 number of entries (N), then 6 arguments per entry:
--   kind     'r' request, 's' request made from a start_urls entry, 'x' start_urls entry that
--            goes to the dead letters, 'd' dead letter, 'l' request to retry later (never
--            filtered or dropped: it is a new attempt of a request already seen), 'S' a
--            request made from a start_urls entry claimed in the crawl's keys, not this
--            shard's (DISTCRAWL_SHARDS): as 's', but no claim list is touched, and one held
--            back at the pending cap is reported at -p - 1 among the positions, so that the
--            caller leaves its entry claimed; 'v' a page to fetch again (DISTCRAWL_RECRAWL_*)
--            after the delay in 'raw' (ms): never filtered or dropped, it replaces the page's
--            revisit still waiting (by fingerprint, KEYS[21]), so that a page has one; a
--            delay of -1 stores nothing and forgets the page's revisit (never again)
--   fp       fingerprint ('' = do not filter)
--   slot     politeness slot (host name, IP address or the request's download_slot)
--   priority integer
--   payload  encoded request, or the dead-letter record for 'x' and 'd'
--   raw      the start_urls entry for 's' and 'x', removed from the claim list with LREM
--            (O(claim list), at most a claim batch; start_urls is not touched); if it is no
--            longer there (the worker was found dead and its claims went back to
--            start_urls, for another worker) the entry is skipped; the delay in ms for 'l'
--            and 'v'; for 'r', the request's fingerprint in KEYS[22] when the crawl has
--            one (a duplicate if it is there, checked before the seen-set), else '';
--            '' otherwise
-- then                 number of feedback records (F), then 5 arguments per record:
--   slot, responses, summed latency (ms), throttled answers (429/503), Retry-After (ms);
--   answers to first attempts only, and to retries carrying a Retry-After (politeness.py)
--
-- Every argument is checked before the first write (Redis keeps what a failing script
-- wrote): a bad one fails the whole commit with an error starting "distcrawl: invalid".
--
-- An acknowledgement retires its request only if the record's token is the one presented:
--   done     the lease is removed and its slot's place freed;
--   late     the lease had expired and the request went back to the queue: it is taken out;
--   stale    the token differs: the request was leased again (or its id reused): no-op;
--   missing  no record: already acknowledged, or lost with Redis data: no-op.
--
-- Returns {enqueued, duplicates, dead, skipped, queue length, dropped, held back, replayed
-- (0/1), late acks, stale acks, missing acks, dropped at the per-slot cap, {positions of the
-- entries not stored}},
-- or {'bloom', layers} from seen_bloom.lua, having written nothing.

local function invalid(what)
  return redis.error_reply('distcrawl: invalid commit: ' .. what)
end

local KINDS = {r = true, s = true, x = true, d = true, l = true, S = true, v = true}
local cap, slot_cap = string.match(ARGV[1], '^(%d+):(%d+)$')
cap, slot_cap = tonumber(cap), tonumber(slot_cap)
local keep_prio = tonumber(ARGV[2])
local t_start, t_max, t_target, t_window, t_share =
  string.match(ARGV[3], '^(%d+):(%d+):([%d.]+):(%d+):([%d.]+)$')
t_start, t_max, t_target = tonumber(t_start), tonumber(t_max), tonumber(t_target)
t_window, t_share = tonumber(t_window), tonumber(t_share)
if not (cap and slot_cap and keep_prio and t_start and t_window and t_window >= 1) then
  return invalid('parameters')
end
local tag, commit_id, want_positions = ARGV[4], ARGV[5], ARGV[6] == '1'

local acks = tonumber(ARGV[7])
if not acks then return invalid('acknowledgement count') end
for i = 8, 7 + 2 * acks, 2 do
  if not ARGV[i] or #(ARGV[i + 1] or '') ~= TOKEN_BYTES then
    return invalid('acknowledgement ' .. ((i - 6) / 2) .. ': no id and token')
  end
end
local base = 8 + 2 * acks
local n = tonumber(ARGV[base])
if not n then return invalid('entry count') end
-- a commit's entries share a few slots: each is checked once
local good_slot = {}
for i = 0, n - 1 do
  local at = base + 1 + i * 6
  local kind, slot = ARGV[at], ARGV[at + 2]
  if not KINDS[kind] then return invalid('entry ' .. i .. ': kind') end
  if not tonumber(ARGV[at + 3]) then return invalid('entry ' .. i .. ': priority') end
  local queued_kind = kind == 'r' or kind == 's' or kind == 'l' or kind == 'S' or kind == 'v'
  if queued_kind and not good_slot[slot] then
    local why = bad_slot(slot)
    if why then return invalid('entry ' .. i .. ': ' .. why) end
    good_slot[slot] = true
  end
  if (kind == 'l' or kind == 'v') and not tonumber(ARGV[at + 5]) then
    return invalid('entry ' .. i .. ': delay')
  end
  if kind == 'v' and ARGV[at + 1] == '' then return invalid('entry ' .. i .. ': fingerprint') end
end
local fb = base + 1 + n * 6
local records = tonumber(ARGV[fb])
if not records then return invalid('feedback count') end
for i = 0, records - 1 do
  local at = fb + 1 + i * 5
  for j = 1, 4 do
    if not tonumber(ARGV[at + j]) then return invalid('feedback ' .. i) end
  end
end

if tag ~= '' and commit_id ~= '' then
  if redis.call('HGET', KEYS[15], tag) == commit_id then
    return {0, 0, 0, 0, redis.call('ZCARD', KEYS[1]), 0, 0, 1, 0, 0, 0, 0, {}}
  end
  redis.call('HSET', KEYS[15], tag, commit_id)
end

local now = now_ms()
local late, stale, missing = 0, 0, 0
-- The acknowledgements' records and places are read in one call each (HMGET, SMISMEMBER)
-- and retired in one call each, their slots' places given back and armed once per slot: what
-- a commit costs Redis grows with its slots, not its pages. A record under the token
-- presented is a lease still held; one under its expired form (lib.lua) a lease that expired
-- while its request was being crawled.
if acks > 0 then
  local ids = {}
  for i = 8, 7 + 2 * acks, 2 do ids[#ids + 1] = ARGV[i] end
  local records = call_many('HMGET', KEYS[2], ids)
  local placeless = call_many('SMISMEMBER', KEYS[17], ids)
  local gone, retired, done, unplaced, landed_in, freed_slots = {}, {}, {}, {}, {}, {}
  for n, id in ipairs(ids) do
    local record = records[n]
    local token = record and string.sub(record, 1, TOKEN_BYTES)
    local still_held = token == ARGV[7 + 2 * n]
    if not record or gone[id] then
      missing = missing + 1
    elseif not still_held and token ~= expired_token(ARGV[7 + 2 * n]) then
      stale = stale + 1
    else
      gone[id] = true
      retired[#retired + 1] = id
      if still_held then
        done[#done + 1] = id
        local slot = entry_slot(record, TOKEN_BYTES + 1)
        if slot then
          if landed_in[slot] == nil then
            landed_in[slot] = 0
            freed_slots[#freed_slots + 1] = slot
          end
          -- a place is given back unless the request holds none (done_with in lib.lua)
          if placeless[n] == 1 then
            unplaced[#unplaced + 1] = id
          else
            landed_in[slot] = landed_in[slot] + 1
          end
        end
      elseif redis.call('ZREM', KEYS[1], string.sub(record, TOKEN_BYTES + 1)) == 1 then
        -- its lease expired and it went back to the queue: it is done, so it must not run again
        late = late + 1
      end
    end
  end
  call_many('HDEL', KEYS[2], retired)
  call_many('ZREM', KEYS[5], done)
  call_many('SREM', KEYS[17], unplaced)
  -- only a slot that got a place back is armed: acknowledging requests that hold none (their
  -- places went back when they left the downloader, places.lua) frees nothing to lease
  local armed = {}
  for _, slot in ipairs(freed_slots) do
    if landed_in[slot] > 0 then
      landed(KEYS[11], KEYS[13], slot, landed_in[slot])
      armed[#armed + 1] = slot
    end
  end
  arm_many(KEYS[9], KEYS[10], armed, now, false)
end

-- request ids: the counter is read once and moved on once, by as many ids as the commit gave
-- out (seq_flush), in the order of its entries
local seq_last, seq_used = nil, 0
local function next_seq()
  if not seq_last then
    seq_last = tonumber(redis.call('GET', KEYS[4]) or 0)
    -- not a number: INCR fails with Redis' own error, before anything else is written
    if not seq_last then redis.call('INCR', KEYS[4]) end
  end
  seq_last, seq_used = seq_last + 1, seq_used + 1
  return seq_last
end
local function seq_flush()
  if seq_used > 0 then redis.call('INCRBY', KEYS[4], decimal(seq_used)) end
end

local function new_entry(slot, prio, payload)
  return make_entry(slot, prio, next_seq(), payload)
end

-- a request stored for later (a retry, a revisit) in ``waiting``, due at ``due``; its id
local function stored_later(slot, prio, payload, waiting, due)
  local entry = new_entry(slot, prio, payload)
  -- ids are unique among records even after Redis lost data and 'seq' went back
  while redis.call('HEXISTS', KEYS[2], entry_id(entry)) == 1 do
    entry = new_entry(slot, prio, payload)
  end
  local id = entry_id(entry)
  redis.call('ZADD', waiting, due, id)
  redis.call('HSET', KEYS[2], id, NO_TOKEN .. entry)
  return id
end

local pending = redis.call('ZCARD', KEYS[1])
-- requests this commit put in the queue (not retries waiting in ``delayed``)
local queued = 0
local claimed = false
local enqueued, duplicates, dead, skipped, dropped, held = 0, 0, 0, 0, 0, 0
local slot_dropped = 0
local not_stored = {}
-- the entries this commit queues, in order, and their slots: they go into the queue (one
-- ZADD) after the loop, their slots armed once each
local to_queue, queued_slots, queued_in = {}, {}, {}
-- requests queued per slot, counted once per slot and call (ZLEXCOUNT: O(log N)), those of
-- this commit included
local in_slot = {}
local function slot_full(slot, prio)
  if slot_cap == 0 or prio >= keep_prio then return false end
  if not in_slot[slot] then
    in_slot[slot] = redis.call('ZLEXCOUNT', KEYS[1], slot_range(slot)) + (queued_in[slot] or 0)
  end
  return in_slot[slot] >= slot_cap
end
-- whether each new request's fingerprint is in the seen-set, read in one call
local fps = {}
for i = 0, n - 1 do
  local at = base + 1 + i * 6
  local kind, fp = ARGV[at], ARGV[at + 1]
  if fp ~= '' and (kind == 'r' or kind == 's' or kind == 'S') then fps[#fps + 1] = fp end
end
seen_prefetch(fps)
for i = 0, n - 1 do
  local at = base + 1 + i * 6
  local kind, fp, slot, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local payload, raw = ARGV[at + 4], ARGV[at + 5]
  local full = cap > 0 and pending >= cap and tonumber(prio) < keep_prio
  if (kind == 's' or kind == 'S') and full then
    held = held + 1
    if want_positions and kind == 'S' then not_stored[#not_stored + 1] = -i - 1 end
  elseif kind == 'r' and full then
    dropped = dropped + 1
    if want_positions then not_stored[#not_stored + 1] = -i - 1 end
  elseif kind == 'r' and slot_cap > 0 and slot_full(slot, tonumber(prio)) then
    slot_dropped = slot_dropped + 1
    if want_positions then not_stored[#not_stored + 1] = -i - 1 end
  else
    local take = true
    if kind == 's' or kind == 'x' then
      take = redis.call('LREM', KEYS[6], -1, raw) == 1
      if take then claimed = true else skipped = skipped + 1 end
    end
    if take then
      if kind == 'x' or kind == 'd' then
        redis.call('LPUSH', KEYS[7], payload)
        dead = dead + 1
      elseif kind == 'v' then
        -- the page's revisit still waiting is replaced; one leased or queued is not
        -- touched (it is this fetch, or one under way): it only stops being the page's
        local old = redis.call('HGET', KEYS[21], fp)
        if old and redis.call('ZREM', KEYS[20], old) == 1 then redis.call('HDEL', KEYS[2], old) end
        if tonumber(raw) < 0 then
          redis.call('HDEL', KEYS[21], fp)
        else
          local id = stored_later(slot, prio, payload, KEYS[20], now + tonumber(raw))
          redis.call('HSET', KEYS[21], fp, id)
          enqueued = enqueued + 1
        end
      elseif kind == 'l' then
        stored_later(slot, prio, payload, KEYS[8], now + tonumber(raw))
        enqueued = enqueued + 1
      elseif kind == 'r' and fp ~= '' and raw ~= ''
          and redis.call('SISMEMBER', KEYS[22], raw) == 1 then
        -- crawled by the crawler this one took over: a duplicate, seen-set or not
        duplicates = duplicates + 1
        if want_positions then not_stored[#not_stored + 1] = i end
      elseif fp == '' or seen_add(fp) == 1 then
        to_queue[#to_queue + 1] = new_entry(slot, prio, payload)
        queued_slots[#queued_slots + 1] = slot
        queued_in[slot] = (queued_in[slot] or 0) + 1
        pending = pending + 1
        queued = queued + 1
        if in_slot[slot] then in_slot[slot] = in_slot[slot] + 1 end
        enqueued = enqueued + 1
      else
        duplicates = duplicates + 1
        if want_positions then not_stored[#not_stored + 1] = i end
      end
    end
  end
end

seen_flush()
seq_flush()
if #to_queue > 0 then
  local args, armed = {}, {}
  for _, entry in ipairs(to_queue) do
    -- a string: a number given to redis.call is formatted there (%.17g), once a request
    args[#args + 1] = '0'
    args[#args + 1] = entry
  end
  call_many('ZADD', KEYS[1], args)
  local distinct = {}
  for _, slot in ipairs(queued_slots) do
    if not armed[slot] then
      armed[slot] = true
      distinct[#distinct + 1] = slot
    end
  end
  arm_many(KEYS[9], KEYS[10], distinct, now, true)
end

if claimed and tag ~= '' and redis.call('EXISTS', KEYS[6]) == 0 then
  redis.call('SREM', KEYS[18], tag)
end

-- politeness feedback. One 429/503 says little: a broken page answers 503 too. What says
-- "slow down" is their share among the slot's recent answers: a moving average over about
-- t_window answers (each answer weighs 1/t_window; a slot starts as if its last answers
-- were fine). When a throttled answer comes while that share is above t_share, the slot is
-- overloaded and backs off like TCP (AIMD), concurrency first:
--   1. its concurrency cap is cut to half of what it had in flight (at least 1); the
--      answers to the requests already in flight say nothing new, so the cap is not cut
--      again before as many answers have come back;
--   2. once the cap is down to 1, the adaptive delay doubles (at least start_ms, at most
--      max_ms, at most once per current delay: the answers to the requests that were in
--      flight when it was raised, a burst of 503s from many workers, say nothing new) and
--      the slot is held back that long, for every worker.
-- Answers that are fine grow the cap by 1 per cap answers (dropped once the slot stays
-- below it and the share is under half of t_share) and bring the delay down: AutoThrottle's
-- rule when a target concurrency is set, else by a quarter per answer. A Retry-After wins
-- over all of this: the slot is held back that long, for every worker, and its delay is at
-- least that. A slot with no cap, nothing to hold and a share under 0.001 has no state.
local keep_per_answer = 1 - 1 / t_window
-- a healthy crawl has no adaptive delay and no state in either hash: one EXISTS a commit
-- says so, where each slot's record would read both (set again once this loop writes one)
local adjusted = records > 0 and redis.call('EXISTS', KEYS[12], KEYS[16]) > 0
for i = 0, records - 1 do
  local at = fb + 1 + i * 5
  local slot, count, latency = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local throttled, retry_after = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local answers = count + throttled
  local stored = adjusted and redis.call('HGET', KEYS[12], slot)
  local old = tonumber(stored) or 0
  local new = old
  local state = adjusted and redis.call('HGET', KEYS[16], slot)
  local conc_cap, share, hold = 0, 0, 0
  if state then
    local a, b, c = string.match(state, '^([%d.]+):([%d.]+):(%d+)$')
    conc_cap, share, hold = tonumber(a) or 0, tonumber(b) or 0, tonumber(c) or 0
  end
  if answers > 0 then
    local keep = math.pow(keep_per_answer, answers)
    share = share * keep + throttled / answers * (1 - keep)
    hold = math.max(0, hold - answers)
  end
  local cut, hold_back = false, 0
  if throttled > 0 and share > t_share and hold <= 0 then
    if conc_cap == 0 or conc_cap >= 2 then
      local flight = (tonumber(redis.call('HGET', KEYS[11], slot)) or 0) + answers
      if conc_cap > 0 then flight = math.min(flight, math.floor(conc_cap)) end
      conc_cap, hold, cut = math.max(1, math.floor(flight / 2)), flight, true
    else
      if now - (tonumber(redis.call('HGET', KEYS[14], slot)) or 0) >= old then
        new = math.min(math.max(old * 2, t_start), t_max)
        redis.call('HSET', KEYS[14], slot, now)
        stored = stored or true
      end
      hold_back = new
    end
  end
  if throttled > 0 and retry_after > 0 then
    new = math.max(new, retry_after)
    hold_back = new
  end
  if hold_back > 0 then
    local until_ = now + hold_back
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
  if conc_cap > 0 and not cut then
    if count > 0 then conc_cap = math.sqrt(conc_cap * conc_cap + 2 * count) end
    if share < t_share / 2 then
      local flight = (tonumber(redis.call('HGET', KEYS[11], slot)) or 0) + answers
      if conc_cap >= flight + 2 then conc_cap = 0 end
    end
  end
  local text = nil
  if conc_cap > 0 or hold > 0 or share >= 0.001 then
    text = string.format('%.3f:%.5f:%d', conc_cap, share, math.floor(hold))
  end
  -- HGET gives false for a slot with no state: compared as nil, so that a slot that has
  -- none and needs none costs no HDEL per commit
  if text ~= (state or nil) then
    if text then
      redis.call('HSET', KEYS[16], slot, text)
      adjusted = true
    else
      redis.call('HDEL', KEYS[16], slot)
    end
  end
  new = math.floor(new)
  if new < 1 then
    if stored then  -- nothing to delete for a slot that had no adaptive delay
      redis.call('HDEL', KEYS[12], slot)
      redis.call('HDEL', KEYS[14], slot)
    end
  elseif new ~= old then
    redis.call('HSET', KEYS[12], slot, new)
    adjusted = true
  end
end
-- wake the idle workers (lib.lua)
wake_idle(KEYS[19], queued)
-- the queue's length: read once above, and counted since (this script only adds to it)
return {
  enqueued, duplicates, dead, skipped, pending, dropped, held, 0,
  late, stale, missing, slot_dropped, not_stored,
}
