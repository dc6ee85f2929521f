-- robots_store.lua: share the robots.txt a worker just downloaded, and free its download lock.
--
-- KEYS[1] robots_txt  STRING robotstxt:<netloc>: "<fetched> <status>\n<body>", fetched in
--                            seconds with ms (this server's TIME)
-- KEYS[2] robots_lock STRING robotstxt:lock:<netloc>, held by the downloading worker
--
-- ARGV[1] time to live (ms): DISTCRAWL_ROBOTS_TTL, so that hosts the crawl no longer visits
--         cost no memory
-- ARGV[2] HTTP status (0: the download failed, read as "allowed")
-- ARGV[3] body
--
-- The stamp is this server's TIME, not the writer's clock: readers on other hosts measure the
-- entry's age with the same server's TIME (``Frontier.robots_txt``), so a skewed host neither
-- keeps a stale robots.txt nor re-reads a fresh one. Returns the stamp (ms).

local now = now_ms()
local fetched = string.format('%d.%03d', math.floor(now / 1000), now % 1000)
local ttl = tonumber(ARGV[1])
if not ttl or ttl < 1 then return redis.error_reply('distcrawl: invalid robots.txt TTL') end
redis.call('SET', KEYS[1], fetched .. ' ' .. ARGV[2] .. '\n' .. ARGV[3], 'PX', math.floor(ttl))
redis.call('DEL', KEYS[2])
return now
