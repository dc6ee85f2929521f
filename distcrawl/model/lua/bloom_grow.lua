-- bloom_grow.lua: add layer L to the Bloom-filter seen-set, once, however many workers ask.
-- Called when the seen-set snippet answered {'bloom', L}: there is no layer yet (L = 0) or
-- layer L-1 is full. Sizes are computed in distcrawl/model/seen.py.
--
-- KEYS[1]      bloom   HASH    the layer metadata (see seen_bloom.lua)
-- KEYS[2 ..]   parts   STRING  the bitmaps of the new layer, one per part
--
-- ARGV[1]  L, the index of the layer to add: nothing is done unless the HASH has L layers
--          and (for L > 0) layer L-1 is full, so a worker that asks late changes nothing
-- ARGV[2]  capacity of the new layer (URLs)
-- ARGV[3]  k, bits set per URL
-- ARGV[4]  bits per part; the layer has #KEYS - 1 parts
-- ARGV[5]  capacity of layer 0, stored when L = 0 (later layers are sized from it)
-- ARGV[6]  error rate of layer 0, stored when L = 0
--
-- Returns {layers now, 1 if this call added the layer else 0}.

local bloom = KEYS[1]
local layer = tonumber(ARGV[1])
local layers = tonumber(redis.call('HGET', bloom, 'layers')) or 0
if layers ~= layer then return {layers, 0} end
if layer > 0 then
  local prev = redis.call('HMGET', bloom, (layer - 1) .. ':n', (layer - 1) .. ':cap')
  if tonumber(prev[1]) < tonumber(prev[2]) then return {layers, 0} end
end
local bits = tonumber(ARGV[4])
for i = 2, #KEYS do
  -- a bitmap left by an earlier crawl must not count as seen; then allocate it in full now
  -- rather than in many reallocations as random bits get set
  redis.call('DEL', KEYS[i])
  redis.call('SETBIT', KEYS[i], bits - 1, 0)
end
if layer == 0 then
  redis.call('HSET', bloom, 'capacity', ARGV[5], 'error_rate', ARGV[6])
end
redis.call('HSET', bloom, layer .. ':cap', ARGV[2], layer .. ':n', 0, layer .. ':k', ARGV[3],
  layer .. ':parts', #KEYS - 1, layer .. ':bits', bits, 'layers', layer + 1)
return {layer + 1, 1}
