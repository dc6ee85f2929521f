-- lease.lua: take requests from the slots whose turn has come, and lease them instead of
-- deleting them. A leased request stays in Redis until it is acknowledged; if its worker
-- dies, the lease expires and requeue.lua puts it back. All times are the Redis server's
-- clock, so workers' clocks do not matter, and the politeness state lives here, so a
-- slot's delay and concurrency hold for the whole cluster, not per worker.
--
-- KEYS[1]  queue          ZSET   queue entries (see lib.lua), all scores 0
-- KEYS[2]  requests       HASH   request id -> queue entry, for leased and delayed requests
-- KEYS[3]  leases         ZSET   request id -> lease deadline (ms)
-- KEYS[4]  delayed        ZSET   request id -> due time (ms) of a retry
-- KEYS[5]  ready          ZSET   slot -> when its next request may be leased (ms)
-- KEYS[6]  slots          HASH   slot -> earliest time of its next request (ms)
-- KEYS[7]  inflight       HASH   slot -> leased requests that hold a place (see KEYS[17])
-- KEYS[8]  throttle       HASH   slot -> adaptive delay (ms)
-- KEYS[9]  limits         HASH   slot -> "<delay ms>:<concurrency>" set while the crawl runs
--                                (either part may be empty: the default applies)
-- KEYS[10] robots         HASH   slot -> robots.txt Crawl-delay (ms); a negative value -T means
--                                one worker is fetching robots.txt until time T
-- KEYS[11] hungry         HASH   slot -> when a worker holding less than its share last found
--                                the slot full
-- KEYS[12] seq            STRING counter for request ids
-- KEYS[13] dead           LIST   dead-letter records (JSON)
-- KEYS[14] stats          HASH   crawl-wide counters ('quarantined')
-- KEYS[15] throttle_state HASH   slot -> "<cap>:<share>:<hold>" (commit.lua): a cap of 1 or more
--                                lowers the slot's concurrency to it
-- KEYS[16] alive          ZSET   worker tag -> time of its last liveness beat (ms)
-- KEYS[17] placeless      SET    ids of leased requests that hold no place (places.lua)
-- KEYS[18] revisits       ZSET   request id -> when the page is due again (ms)
-- KEYS[19] revisit_queue  ZSET   due revisits' queue entries, all scores 0, laid out as KEYS[1]
--
-- ARGV[1] how many requests to take at most
-- ARGV[2] lease duration (ms)
-- ARGV[3] how many due retries to move into the queue first, at most
-- ARGV[4] how many ready slots to look at, at most
-- ARGV[5] default delay between two requests of a slot (ms)
-- ARGV[6] default concurrency of a slot
-- ARGV[7] per-slot defaults from the settings, JSON {slot: [delay ms, concurrency]} (-1 for
--         a value not set), or ''
-- ARGV[8] '' when robots.txt is not obeyed, else "<probe timeout ms>:<max Crawl-delay ms>"
-- ARGV[9] JSON {slot: requests the caller holds}, or ''
-- ARGV[10] the caller's worker tag (4 bytes), the first half of each lease token
-- ARGV[11] a number below 2^32 that differs from call to call: the tokens' second halves
--          count up from it, and it jitters the adaptive delay
-- ARGV[12] a worker is alive while its last beat is younger than this (ms)
-- ARGV[13] how many reserves the caller may hold per slot, at most (0: none)
-- ARGV[14] JSON {slot: reserves the caller holds}, or ''
-- ARGV[15] the share of a slot's requests taken from the due revisits (KEYS[19]) while new
--          ones (KEYS[1]) wait too, 0 to 1 (DISTCRAWL_RECRAWL_SHARE)
-- ARGV[16] how many reserves the caller may hold per place it holds in a slot (at least 1;
--          absent: 1): what one place may send between two of the caller's batches, less
--          the request in it (DistcrawlConfig.reserves_per_place)
--
-- Revisits: due ones move (up to ARGV[3], like retries) into their own queue, KEYS[19], and a
-- slot's turn takes its requests from both queues, ARGV[15] of them from the revisits
-- (rounded at random, so that a slot with a delay, one request a turn, gets revisits at
-- that share of its turns); when one queue of the slot is empty the other has every turn.
-- The slot's delay and concurrency count both alike.
--
-- A slot's delay is the longest of its configured delay, its Crawl-delay and its adaptive
-- delay (commit.lua); the adaptive one is jittered, 0.5 to 1.5 times its value, so that a
-- slowed-down slot is not hit at a fixed beat. Its concurrency is the configured one, or
-- the adaptive cap commit.lua set after 429/503 answers, if lower.
--
-- A slot with a delay gives one request per turn; one at its concurrency limit is looked
-- at again after RECHECK_FULL_MS, or sooner when a response (places.lua), an
-- acknowledgement or a requeue frees a place (arm() in lib.lua); one whose
-- robots.txt nobody has read yet gives a single request, whose worker reads robots.txt
-- and records its Crawl-delay (robots.lua) before the slot opens.
--
-- Fair share: the worker that acknowledges a request asks for the next one in the same
-- step, so without a rule it would keep a full slot to itself. While a slot is contended
-- (a worker holding less than its share found it full in the last second), no worker takes
-- more than its share: the slot's places divided among the live workers (at least two, as
-- one is waiting), rounded up, and the worker that is short asks again within
-- RECHECK_HUNGRY_MS. Halves were not enough: with four workers, two holding half each kept
-- the other two out of a slot for a whole crawl.
--
-- Reserves (for a worker holding at most its share of the slot among the live workers): a
-- request takes its place from its lease until it leaves the downloader, and a
-- worker learns that a place is free one batch later (the answer's report, the next lease:
-- tens of ms on a busy worker), which at 100 ms a page cost a third of the slot's
-- concurrency. So a worker holding places of a slot without a delay also gets
-- reserves: leased requests that hold no place (in 'placeless'). It sends one only in the
-- place of a request of the same slot that left its downloader, at once, and reports the
-- swap afterwards (places.lua): the site never sees more than the slot's concurrency. On a
-- contended slot, only while its queue holds, beyond this turn, a place and a whole set of
-- reserves for every live worker: there they keep no request from a worker short of one,
-- and each worker refills its share once a batch rather than as the batches report its
-- places free (two workers on one slot at 100 ms a page took four requests a batch). A
-- worker holds up to ARGV[16] reserves a place, one for each answer the place may give
-- before the worker's next batch brings more (3 at the 0.2 s interval: 20 pages a second a
-- place, as the 0.1 s interval allowed with one).
--
-- A queue member that is not a well-formed entry (entry_slot) is moved to the dead letters
-- where it is met (quarantine), so it can neither stop this script nor stay in the queue.
-- While no slot is ready but the queue is not empty, its first members are looked at: a
-- well-formed one's slot was lost from 'ready' and is armed again, any other is quarantined,
-- so that nothing sits in the queue where no lease would ever look.
--
-- Returns {queue length, retries still waiting, retries released, ms until the next slot
--          is ready or the next retry is due (-1: neither), now (ms), members quarantined,
--          retries whose record was missing, slots armed again,
--          paced1, token1, entry1, paced2, token2, entry2, ...}, the requests in the
--          rotation's order (below): by priority, equal ones taking the slots in turn;
--          paced is 1 for a request of a slot with a delay: its turn began now, so the
--          worker sends it before whatever else it holds, and reports when it did
--          (sent.lua), lest the gap to the next worker's turn shrink by its own lag;
--          2 for a reserve.

local RECHECK_FULL_MS = 250
-- a worker below its share that found a slot full asks again this soon: the places the
-- others free while they are over their shares are for it, and stay empty until it asks
local RECHECK_HUNGRY_MS = 50
local starved = false
local now = now_ms()
-- ``now`` as redis.call is given it (lib.lua's decimal)
local now_s = decimal(now)
local want, lease_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
-- the lease deadline, made a string once: a number given to redis.call is formatted there,
-- once per request of the lease's ZADD
local deadline = tostring(now + lease_ms)
local default_delay, default_conc = tonumber(ARGV[5]), tonumber(ARGV[6])
local overrides = {}
if ARGV[7] ~= '' then overrides = cjson.decode(ARGV[7]) end
local held = {}
if ARGV[9] ~= '' then held = cjson.decode(ARGV[9]) end
local probe_ms, crawl_delay_max = nil, nil
if ARGV[8] ~= '' then
  probe_ms, crawl_delay_max = string.match(ARGV[8], '^(%d+):(%d+)$')
  probe_ms, crawl_delay_max = tonumber(probe_ms), tonumber(crawl_delay_max)
end

local tag, nonce = ARGV[10], tonumber(ARGV[11])
local revisit_share = tonumber(ARGV[15]) or 0
local jitter = 0.5 + (nonce % 1024) / 1024
local alive_ms = tonumber(ARGV[12])
local reserve_max = tonumber(ARGV[13]) or 0
local per_place = math.max(1, tonumber(ARGV[16]) or 1)
local reserved = {}
if (ARGV[14] or '') ~= '' then reserved = cjson.decode(ARGV[14]) end
local live = nil
local function live_workers()
  if not live then live = redis.call('ZCOUNT', KEYS[16], decimal(now - alive_ms), '+inf') end
  return live
end
-- a worker's share of a contended slot: someone is waiting, so at least two share it
local function share_of(conc)
  return math.max(1, math.ceil(conc / math.max(2, live_workers())))
end
local out = {0, 0, 0, -1, now, 0, 0, 0}
local function quarantined(raw, reason, queue)
  redis.call('ZREM', queue or KEYS[1], raw)
  quarantine(KEYS[13], KEYS[14], raw, reason, now)
  out[6] = out[6] + 1
end

-- due requests waiting in ``waiting`` (retries, revisits) move into ``queue``
-- per key, its first member's score read where nothing changed it since (false: the key is
-- empty), so that the end of this call need not read it again
local first_at = {}
local function promote(waiting, queue, what)
  -- most calls have nothing due: one read says so, and when the next one is due
  local head = redis.call('ZRANGE', waiting, '0', '0', 'WITHSCORES')
  if #head == 0 or tonumber(head[2]) > now then
    first_at[waiting] = #head > 0 and tonumber(head[2])
    return
  end
  local due = redis.call('ZRANGEBYSCORE', waiting, '-inf', now_s, 'LIMIT', '0', ARGV[3])
  for _, id in ipairs(due) do
    redis.call('ZREM', waiting, id)
    local record = redis.call('HGET', KEYS[2], id)
    if record then
      redis.call('HDEL', KEYS[2], id)
      local entry = string.sub(record, TOKEN_BYTES + 1)
      local slot = entry_slot(entry)
      if slot then
        redis.call('ZADD', queue, '0', entry)
        arm(KEYS[5], KEYS[6], slot, now, true)
        out[3] = out[3] + 1
      else
        quarantine(KEYS[13], KEYS[14], entry, 'malformed ' .. what .. ' record', now)
        out[6] = out[6] + 1
      end
    else
      out[7] = out[7] + 1
    end
  end
end
-- a crawl with no retry waiting and no revisit (most calls): one EXISTS says so, where the
-- promotions and the revisits' queue would read three keys
local revisits_queued = false
if redis.call('EXISTS', KEYS[4], KEYS[18], KEYS[19]) > 0 then
  promote(KEYS[4], KEYS[1], 'retry')
  promote(KEYS[18], KEYS[19], 'revisit')
  revisits_queued = redis.call('ZCARD', KEYS[19]) > 0
else
  first_at[KEYS[4]], first_at[KEYS[18]] = false, false
end

-- a slot's next ``count`` entries of ``queue`` (one more, to know whether any is left)
local function slot_entries(queue, slot, count)
  local lo, hi = slot_range(slot)
  return redis.call('ZRANGEBYLEX', queue, lo, hi, 'LIMIT', '0', decimal(count + 1))
end

-- how many of ``count`` requests a slot takes from its due revisits, having ``revisits`` of
-- them and ``fresh`` new ones: the share, rounded at random, and what the other lacks
local turns = 0
local function revisits_of(count, revisits, fresh)
  local quota = count * revisit_share
  -- uniform in [0, 1): the call's random nonce, mixed with the turn (an odd multiplier
  -- permutes 16-bit values; every product stays exact in a double)
  turns = turns + 1
  local u = ((((nonce % 65536) + turns * 7919) % 65536) * 40503 % 65536) / 65536
  quota = math.floor(quota) + ((u < quota - math.floor(quota)) and 1 or 0)
  quota = math.max(quota, count - #fresh)
  return math.min(#revisits, quota)
end

-- none of the operator's limits, adaptive delays or adaptive caps is set (a healthy crawl):
-- read with one EXISTS a call, so that a visit need not read three hashes for each slot
local adjusted = nil
local function plain()
  if adjusted == nil then adjusted = redis.call('EXISTS', KEYS[9], KEYS[8], KEYS[15]) > 0 end
  return not adjusted
end

local function limits(slot)
  local delay, conc = default_delay, default_conc
  local o = overrides[slot]
  if o then
    if o[1] >= 0 then delay = o[1] end
    if o[2] >= 0 then conc = o[2] end
  end
  local set = not plain() and redis.call('HGET', KEYS[9], slot)
  if set then
    local d, c = string.match(set, '^(%d*):(%d*)$')
    delay, conc = tonumber(d) or delay, tonumber(c) or conc
  end
  return delay, conc
end

-- the concurrency after the adaptive cap commit.lua set on 429/503 answers, if lower
local function capped(slot, conc)
  local state = not plain() and redis.call('HGET', KEYS[15], slot)
  if state then
    local conc_cap = tonumber(string.match(state, '^([%d.]+):'))
    if conc_cap and conc_cap >= 1 then conc = math.min(conc, math.floor(conc_cap)) end
  end
  return conc
end

-- this worker holds less than its share of a full slot: the slot is contended
local marked = {}
local function hungry(slot, conc)
  if (held[slot] or 0) < share_of(conc) then
    if not marked[slot] then redis.call('HSET', KEYS[11], slot, now_s) end
    marked[slot] = true
    starved = true
  end
end
-- per slot visited: its concurrency and its requests in flight after the visit, so that the
-- parked slots' check below reads nothing again
local conc_of, inflight_of = {}, {}

-- the priority of a well-formed entry whose slot ends at ``cut`` (entry_fields without
-- copying the payload)
local function entry_priority(entry, cut)
  local b1, b2, b3, b4 = string.byte(entry, cut + 1, cut + 4)
  return 2147483648 - (((b1 * 256 + b2) * 256 + b3) * 256 + b4)
end

-- what this lease hands out, in the order leased: kind, token, entry and slot of each, in
-- four arrays (no table a request); ordered before they go into ``out`` (the rotation below)
local leased, leased_kind, leased_token, leased_entry, leased_slot = 0, {}, {}, {}, {}
-- the ids this call leased (a reused id must not name two of them)
local leased_ids = {}
-- per slot: its place among the candidates; per slot that gave requests, where the NUL
-- after it is in its entries (``cut`` in visit), and how many slots gave
local order, gave, slots_given = {}, {}, 0

-- One visit of a ready slot: it gives up to ``room`` requests (places, then reserves).
-- Returns true when it gave all of ``room`` and could give more in another visit.
-- ``first``: the slot's first visit in this lease, the only one that parks a full slot.
local function visit(slot, room, first)
  local delay, conc = limits(slot)
  local probe, wait_until = false, nil
  if probe_ms then
    local crawl_delay = tonumber(redis.call('HGET', KEYS[10], slot))
    if crawl_delay == nil or (crawl_delay < 0 and -crawl_delay <= now) then
      probe = true
    elseif crawl_delay < 0 then
      wait_until = -crawl_delay
    else
      delay = math.max(delay, math.min(crawl_delay, crawl_delay_max))
    end
  end
  local adaptive = not plain() and tonumber(redis.call('HGET', KEYS[8], slot)) or 0
  if adaptive > delay then delay = math.max(delay, math.floor(adaptive * jitter)) end
  conc = capped(slot, conc)
  local inflight = tonumber(redis.call('HGET', KEYS[7], slot)) or 0
  conc_of[slot], inflight_of[slot] = conc, inflight
  local take = math.min(conc - inflight, room)
  if delay > 0 or probe then take = math.min(take, 1) end
  local mine = held[slot] or 0
  local contended = tonumber(redis.call('HGET', KEYS[11], slot))
  contended = contended ~= nil and now - contended < 1000
  if take > 0 and contended then take = math.min(take, share_of(conc) - mine) end
  -- reserves: up to per_place for each place this worker holds, at most reserve_max, on a
  -- slot without a delay, for a worker holding no more than its share of the places (see
  -- Reserves above)
  local extra = 0
  if reserve_max > 0 and delay == 0 and not probe and not wait_until then
    local placed = mine + math.max(take, 0)
    local may
    if not contended then
      -- not beyond its share among the live workers: reserves would keep the places
      may = placed <= math.max(1, math.ceil(conc / math.max(1, live_workers())))
    else
      -- within its share, and requests enough queued for everyone's places and reserves
      may = placed <= share_of(conc) and redis.call('ZLEXCOUNT', KEYS[1], slot_range(slot))
        >= math.max(take, 0) + live_workers() * (conc + reserve_max)
    end
    if may then
      extra = math.min(reserve_max, per_place * placed) - (reserved[slot] or 0)
      extra = math.max(0, math.min(extra, room - math.max(take, 0)))
    end
  end
  if not first and (take <= 0 and extra <= 0) then
    return false  -- it gave its places in an earlier visit, where it was parked if full
  elseif wait_until then
    redis.call('ZADD', KEYS[5], decimal(wait_until), slot)
  elseif conc - inflight <= 0 and extra <= 0 then
    -- full: looked at again soon (so that waiting workers keep saying so), or as soon as
    -- an acknowledgement frees a place (arm())
    redis.call('ZADD', KEYS[5], decimal(now + RECHECK_FULL_MS), slot)
    hungry(slot, conc)
  elseif take <= 0 and extra <= 0 then
    -- this worker has its share of a contended slot: the free places are for the others
  else
    take = math.max(take, 0)
    local fresh = slot_entries(KEYS[1], slot, take + extra)
    local revisits, from_revisits = {}, 0
    if revisits_queued then
      revisits = slot_entries(KEYS[19], slot, take + extra)
      from_revisits = revisits_of(take + extra, revisits, fresh)
    end
    -- the revisits this turn takes first (from KEYS[19]), then new requests (KEYS[1])
    local entries = fresh
    if from_revisits > 0 then
      entries = {}
      for i = 1, from_revisits do entries[i] = revisits[i] end
      for _, entry in ipairs(fresh) do entries[#entries + 1] = entry end
    end
    -- which entries this turn takes, in order: places first, then reserves; a malformed
    -- one is quarantined where it is met. Every member of the slot's range starts with
    -- "<slot>\0" (slot_range), so entry_slot's check comes down to the length, and the NUL
    -- after the slot is at ``cut`` in each: its id and priority follow. A slot holding a
    -- NUL itself (one that others wrote to 'ready') has no well-formed entry at all.
    local cut = not string.find(slot, '\0', 1, true) and #slot + 1
    local shortest = cut and cut + 10
    local taken, reserves, used = 0, 0, 0
    local picked, ids, from_queue, from_revisit = {}, {}, {}, {}
    for i, entry in ipairs(entries) do
      if taken + reserves >= take + extra then break end
      used = i
      if not (cut and #entry >= shortest) then
        quarantined(entry, 'malformed queue entry', i <= from_revisits and KEYS[19] or KEYS[1])
      else
        picked[#picked + 1] = entry
        ids[#ids + 1] = entry_id(entry, cut)
        local list = i <= from_revisits and from_revisit or from_queue
        list[#list + 1] = entry
        if taken < take then taken = taken + 1 else reserves = reserves + 1 end
      end
    end
    -- and they are leased with one call per command for the turn (ZREM from each queue,
    -- HMGET, HSET, ZADD, SREM/SADD), not one per request
    call_many('ZREM', KEYS[1], from_queue)
    call_many('ZREM', KEYS[19], from_revisit)
    local records = call_many('HMGET', KEYS[2], ids)
    local writes, deadlines, placed, unplaced = {}, {}, {}, {}
    for n, entry in ipairs(picked) do
      local id, record = ids[n], records[n]
      -- a record under this id that is not this request's: 'seq' went back after Redis
      -- lost data, and the id is reused (by a record, or by a request this call leased);
      -- this request gets a new one
      while (record and string.sub(record, TOKEN_BYTES + 1) ~= entry) or leased_ids[id] do
        local prio, payload = entry_fields(entry)
        entry = make_entry(slot, prio, redis.call('INCR', KEYS[12]), payload)
        id = entry_id(entry)
        record = redis.call('HGET', KEYS[2], id)
      end
      leased_ids[id] = true
      local token = tag .. struct.pack('>I4', (nonce + leased) % 4294967296)
      writes[#writes + 1] = id
      writes[#writes + 1] = token .. entry
      deadlines[#deadlines + 1] = deadline
      deadlines[#deadlines + 1] = id
      local kind
      if n <= taken then
        placed[#placed + 1] = id  -- a new lease takes a place of its own
        kind = delay > 0 and 1 or 0
      else
        unplaced[#unplaced + 1] = id  -- a reserve: no place until it takes one
        kind = 2
      end
      leased = leased + 1
      leased_kind[leased], leased_token[leased] = kind, token
      leased_entry[leased], leased_slot[leased] = entry, slot
    end
    if #picked > 0 and not gave[slot] then
      gave[slot] = cut
      slots_given = slots_given + 1
    end
    call_many('HSET', KEYS[2], writes)
    call_many('ZADD', KEYS[3], deadlines)
    call_many('SREM', KEYS[17], placed)
    call_many('SADD', KEYS[17], unplaced)
    want = want - taken - reserves
    held[slot] = mine + taken
    reserved[slot] = (reserved[slot] or 0) + reserves
    if taken > 0 then
      inflight = redis.call('HINCRBY', KEYS[7], slot, decimal(taken))
      inflight_of[slot] = inflight
    end
    local next_at = now
    if taken > 0 then
      -- with no delay too: the time of the slot's last lease, by which sweep.lua knows a
      -- slot the crawl has finished with (its next turn is then simply now)
      next_at = now + delay
      redis.call('HSET', KEYS[6], slot, decimal(next_at))
    end
    if probe and taken > 0 then
      redis.call('HSET', KEYS[10], slot, decimal(-(now + probe_ms)))
      next_at = now + probe_ms
    end
    -- whether the slot has anything left in either queue after this turn
    local left = not (used == #entries and #fresh <= take + extra and #revisits <= from_revisits)
    if not left then
      redis.call('ZREM', KEYS[5], slot)
      redis.call('HDEL', KEYS[11], slot)
    elseif inflight >= conc then
      redis.call('ZADD', KEYS[5], decimal(math.max(now + RECHECK_FULL_MS, next_at)), slot)
    else
      redis.call('ZADD', KEYS[5], decimal(next_at), slot)
    end
    return left and taken + reserves >= room and inflight < conc and delay == 0 and not probe
  end
  return false
end

-- The rotation: a lease shares what it may take among the ready slots in turns, as Scrapy's
-- DownloaderAwarePriorityQueue does on equal priority (a1, b1, a2, b2), so that a broad
-- crawl's first seconds go to many sites, not to the first ones' whole concurrency. Each
-- turn offers every slot still giving an equal part of what is wanted; one that gives less
-- (short of requests, of places, or one request a turn for a slot with a delay) leaves the
-- rest to the others in the next turn. The last turn takes what it can, slot after slot.
-- A slot's entries are read once per visit, so a single slot is one read as before, and
-- a lease visits no more slots than it takes from (plus those in front of them that give
-- nothing, as before). The leased requests are then ordered by priority, ties by their
-- rank among their slot's requests of that priority, then by the slot's place: a1, b1, a2,
-- b2.
local TURNS = 3
local function ready_now()
  return redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_s, 'LIMIT', '0', ARGV[4])
end
local active = ready_now()
local head = #active == 0 and redis.call('ZRANGE', KEYS[5], '0', '0', 'WITHSCORES')
-- with no slot ready, nothing below changes 'ready': its first turn holds for the end
if head then first_at[KEYS[5]] = #head > 0 and tonumber(head[2]) end
-- no slot in 'ready' at all: a slot lost from it is armed again
if head and #head == 0 then
  for _, queue in ipairs({KEYS[1], KEYS[19]}) do
    for _, member in ipairs(redis.call('ZRANGE', queue, '0', '15')) do
      local slot = entry_slot(member)
      if slot then
        redis.call('ZADD', KEYS[5], 'NX', now_s, slot)
        out[8] = out[8] + 1
      else
        quarantined(member, 'malformed queue entry', queue)
      end
    end
  end
  if out[8] > 0 then
    active = ready_now()
    first_at[KEYS[5]] = nil
  end
end
for i, slot in ipairs(active) do order[slot] = i end
local turn = 0
while want > 0 and #active > 0 do
  turn = turn + 1
  local room = turn >= TURNS and want or math.ceil(want / #active)
  local again = {}
  for _, slot in ipairs(active) do
    if want <= 0 then break end
    if visit(slot, math.min(room, want), turn == 1) then again[#again + 1] = slot end
  end
  active = again
end
-- one slot's requests are in that order already (a visit gives them by priority, then
-- first in first out, never above an earlier one): sorting them, and reading their
-- priorities, is Lua work a request and more, for nothing
local rotation = {}
if slots_given > 1 then
  -- per slot: its lowest priority so far, how many of that priority it gave
  local lowest, given = {}, {}
  for i = 1, leased do
    local slot = leased_slot[i]
    -- never above an earlier one of the slot (sorting keeps each slot's own order); its
    -- rank counts the slot's requests of that priority
    local prio = math.min(entry_priority(leased_entry[i], gave[slot]), lowest[slot] or math.huge)
    given[slot] = prio == lowest[slot] and given[slot] + 1 or 1
    lowest[slot] = prio
    rotation[i] = {prio, given[slot], order[slot], i}
  end
  table.sort(rotation, function(x, y)
    if x[1] ~= y[1] then return x[1] > y[1] end
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[3] < y[3]
  end)
end
local n = #out
for r = 1, leased do
  local i = rotation[r] and rotation[r][4] or r
  out[n + 1], out[n + 2], out[n + 3] = leased_kind[i], leased_token[i], leased_entry[i]
  n = n + 3
end
-- slots parked at their limit (a worker that frees a place leases again in the same step and
-- parks the slot anew, so a waiting worker would rarely find it ready): a worker that still
-- wants requests and holds less than its share of one says so, or the fair share never acts
if want > 0 then
  local parked = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now_s,
    decimal(now + RECHECK_FULL_MS), 'LIMIT', '0', ARGV[4])
  for _, slot in ipairs(parked) do
    local conc, inflight = conc_of[slot], inflight_of[slot]
    if conc == nil then
      local _, c = limits(slot)
      conc = capped(slot, c)
      inflight = tonumber(redis.call('HGET', KEYS[7], slot)) or 0
    end
    if inflight >= conc then hungry(slot, conc) end
  end
end
-- (this call only takes from the revisits' queue: empty after the promotion, empty now)
out[1] = redis.call('ZCARD', KEYS[1]) + (revisits_queued and redis.call('ZCARD', KEYS[19]) or 0)
out[2] = first_at[KEYS[4]] == false and 0 or redis.call('ZCARD', KEYS[4])
-- the next slot's turn, or the next retry or revisit coming due, whichever is sooner: an
-- idle worker asks again then, instead of leaving every due retry to a busy one
for _, key in ipairs({KEYS[5], KEYS[4], KEYS[18]}) do
  local at = first_at[key]
  if at == nil then
    local first = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
    at = #first > 0 and tonumber(first[2])
  end
  if at then
    local wait = math.max(0, at - now)
    if out[4] < 0 or wait < out[4] then out[4] = wait end
  end
end
if starved and (out[4] < 0 or out[4] > RECHECK_HUNGRY_MS) then out[4] = RECHECK_HUNGRY_MS end
return out
