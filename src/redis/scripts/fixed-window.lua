-- Fixed window counter.
--
-- KEYS[1]  hash `<prefix>:{<key>}:fw`; fields `w` = start of the counted window (epoch ms),
--          `c` = cost admitted in that window.
-- ARGV[1]  limit: cost admitted per window (integer > 0).
-- ARGV[2]  window_ms: window length in milliseconds (integer > 0).
-- ARGV[3]  cost: cost of this call (integer >= 0; 0 peeks without writing).
-- Returns  {allowed (1|0), remaining, reset_at_ms, retry_after_ms}, all integers.
--
-- Windows are aligned to epoch multiples of window_ms on the Redis clock (TIME), never the
-- caller's. The window start is stored beside the count, so a leftover key from an older window
-- is recognised and restarted rather than trusted to have expired on the exact millisecond. The
-- count and its PEXPIRE are written in this one script, so the key never exists without a TTL.
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local window_start = now_ms - (now_ms % window_ms)
local reset_at_ms = window_start + window_ms

local stored = redis.call('HMGET', KEYS[1], 'w', 'c')
local count = 0
if tonumber(stored[1]) == window_start then
  count = tonumber(stored[2]) or 0
end

if count + cost > limit then
  return {0, limit - count, reset_at_ms, reset_at_ms - now_ms}
end

if cost > 0 then
  count = count + cost
  redis.call('HSET', KEYS[1], 'w', window_start, 'c', count)
  redis.call('PEXPIRE', KEYS[1], reset_at_ms - now_ms)
end
return {1, limit - count, reset_at_ms, 0}
