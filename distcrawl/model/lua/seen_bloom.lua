-- seen_bloom.lua: the Bloom-filter seen-set (DISTCRAWL_SEEN = "bloom"), plain Redis bitmaps,
-- no module. Not a script on its own: distcrawl/model/lua/__init__.py prepends it to the scripts
-- that need the seen-set (commit.lua, seen.lua) and sets SEEN_KEYS, the index of its first
-- key in their KEYS, first. Layers are created by bloom_grow.lua; sizing is in seen.py.
--
-- KEYS[SEEN_KEYS]         bloom  HASH    layers = L; per layer i (from 0): i:cap, i:n (URLs
--                                        added), i:k (bits per URL), i:parts, i:bits (bits
--                                        per part); also capacity and error_rate of layer 0
-- KEYS[SEEN_KEYS+1 ..]    bitmaps STRING every part of every layer, layer 0 first and each
--                                        layer's parts in order; they are the last KEYS
--
-- Runs first, before the script it is prepended to has written anything, and ends that
-- script with {'bloom', L} when the caller has to act first: no layer yet, the caller's
-- keys are not exactly the layers the HASH lists (another worker added one), or the newest
-- layer is full. The caller then adds the next layer (bloom_grow.lua) or re-reads the HASH,
-- and sends the same script again; so no layer is ever written that was not in KEYS, and a
-- full layer takes at most one script's worth of URLs beyond its capacity.
--
-- Defines:
--   seen_add(fp)  1 if fp was new (its bits are now set in the newest layer and that layer's
--                 count is incremented), 0 if it was probably seen (all its bits are set in
--                 some layer; wrong with the configured false-positive probability)
--   seen_has(fp)  the same answer without writing anything
--   seen_prefetch(fps), seen_flush()  nothing (seen_set.lua batches its reads and writes
--                 with them; each of a Bloom filter's bits is read and set where it is met)
--
-- Lua does no hashing: fp is already a SHA1-based fingerprint, so its first 12 bytes give
-- two independent 48-bit numbers h1 and h2, and the k bit positions in a layer of m bits are
-- made from them by enhanced double hashing (Dillinger and Manolios, 2004):
-- x = h1 mod m, y = h2 mod m, then x += y, y += i (mod m) for each further bit.
-- math.fmod is exact on doubles, and every value stays below 2^53.

local bloom_meta = redis.call('HGETALL', KEYS[SEEN_KEYS])
local bloom_info = {}
for i = 1, #bloom_meta, 2 do bloom_info[bloom_meta[i]] = bloom_meta[i + 1] end
local bloom_n = tonumber(bloom_info['layers']) or 0
local bloom_layers = {}
local bloom_next_key = SEEN_KEYS + 1
for i = 0, bloom_n - 1 do
  local parts = tonumber(bloom_info[i .. ':parts'])
  local bits = tonumber(bloom_info[i .. ':bits'])
  bloom_layers[i + 1] = {
    k = tonumber(bloom_info[i .. ':k']), parts = parts, bits = bits, m = parts * bits,
    first = bloom_next_key,
  }
  bloom_next_key = bloom_next_key + parts
end
if bloom_n == 0 or bloom_next_key ~= #KEYS + 1
    or tonumber(bloom_info[(bloom_n - 1) .. ':n']) >= tonumber(bloom_info[(bloom_n - 1) .. ':cap']) then
  return {'bloom', bloom_n}
end
local bloom_count_field = (bloom_n - 1) .. ':n'

local bloom_fmod, bloom_floor, bloom_unpack = math.fmod, math.floor, unpack

-- calls visit(key index, offset) for each of fp's k bits in a layer, in order, until it
-- returns true; returns whether it did
local function bloom_walk(layer, h1, h2, visit)
  local m, bits, parts = layer.m, layer.bits, layer.parts
  local x, y = bloom_fmod(h1, m), bloom_fmod(h2, m)
  for i = 1, layer.k do
    local part = 0
    if parts > 1 then part = bloom_floor(x / bits) end
    if visit(layer.first + part, x - part * bits) then return true end
    -- x + y < 2m and y + i < m + k: one subtraction replaces the modulo
    x = x + y
    if x >= m then x = x - m end
    y = y + i
    if y >= m then y = y - m end
  end
  return false
end

local function bloom_unset(key, offset)
  return redis.call('GETBIT', KEYS[key], offset) == 0
end

-- whether all of fp's bits are set in a layer: GETBIT until the first 0, which for a URL
-- not in the layer comes after 2 bits on average (a full layer has half its bits set)
local function bloom_in(layer, h1, h2)
  return not bloom_walk(layer, h1, h2, bloom_unset)
end

-- sets fp's bits in a layer and says whether they all were set already; one BITFIELD per
-- part sets all of them, far cheaper than k SETBIT calls from Lua
local function bloom_set(layer, h1, h2)
  local per_part = {}
  bloom_walk(layer, h1, h2, function(key, offset)
    local a = per_part[key]
    if not a then
      a = {}
      per_part[key] = a
    end
    local n = #a
    a[n + 1], a[n + 2], a[n + 3], a[n + 4] = 'SET', 'u1', offset, 1
  end)
  local set = 0
  for key, a in pairs(per_part) do
    local old = redis.call('BITFIELD', KEYS[key], bloom_unpack(a))
    for j = 1, #old do set = set + old[j] end
  end
  return set == layer.k
end

local function bloom_hashes(fp)
  if #fp < 12 then fp = fp .. string.rep('\0', 12 - #fp) end
  local h1, h2 = struct.unpack('>I6I6', fp)
  return h1, h2
end

local function seen_has(fp)
  local h1, h2 = bloom_hashes(fp)
  for i = bloom_n, 1, -1 do
    if bloom_in(bloom_layers[i], h1, h2) then return 1 end
  end
  return 0
end

local function seen_add(fp)
  local h1, h2 = bloom_hashes(fp)
  for i = bloom_n - 1, 1, -1 do
    if bloom_in(bloom_layers[i], h1, h2) then return 0 end
  end
  if bloom_set(bloom_layers[bloom_n], h1, h2) then return 0 end
  redis.call('HINCRBY', KEYS[SEEN_KEYS], bloom_count_field, 1)
  return 1
end

local function seen_prefetch(_) end

local function seen_flush() end
