-- Token bucket refilled continuously on the Redis clock.
--
-- KEYS[1]  hash `<prefix>:{<key>}:tb`; fields `tokens` = tokens left at `ts` (decimal string,
--          may be fractional), `ts` = time of that count (epoch microseconds).
-- ARGV[1]  capacity: bucket size, the largest burst (number > 0).
-- ARGV[2]  refill_per_sec: tokens added per second (number > 0).
-- ARGV[3]  cost: tokens this call takes (number >= 0; 0 peeks without writing).
-- Returns  {allowed (1|0), remaining (decimal string, 6 places), reset_at_ms, retry_after_ms};
--          remaining is a string because Redis truncates Lua numbers in replies to integers.
--
-- A missing key is a full bucket, so the key only has to live until the bucket would be full
-- again: its PEXPIRE is exactly that time. If the Redis clock steps backwards, no tokens are
-- added until it passes the stored time again (the stored time never moves backwards).
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now_us / 1000)
local capacity = tonumber(ARGV[1])
local refill_per_sec = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
-- Refill arithmetic is in doubles; allow for their rounding so an exactly refilled token counts.
local epsilon = 1e-9

local stored = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = capacity
local ts = now_us
if stored[1] then
  tokens = tonumber(stored[1])
  ts = tonumber(stored[2])
  if now_us > ts then
    tokens = math.min(capacity, tokens + (now_us - ts) * refill_per_sec / 1000000)
    ts = now_us
  end
end

local function ms_to_refill(amount)
  if amount <= epsilon then return 0 end
  return math.ceil(amount * 1000 / refill_per_sec)
end

local function text(amount)
  if amount < 0 then amount = 0 end
  return string.format('%.6f', math.floor(amount * 1000000 + epsilon) / 1000000)
end

if tokens + epsilon < cost then
  local retry_ms = ms_to_refill(cost - tokens)
  if retry_ms < 1 then retry_ms = 1 end
  return {0, text(tokens), now_ms + ms_to_refill(capacity - tokens), retry_ms}
end

if cost > 0 then
  tokens = math.max(0, tokens - cost)
  local ttl_ms = ms_to_refill(capacity - tokens)
  if ttl_ms < 1 then ttl_ms = 1 end
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.0f', ts))
  redis.call('PEXPIRE', KEYS[1], ttl_ms)
end
return {1, text(tokens), now_ms + ms_to_refill(capacity - tokens), 0}
