-- Token bucket refilled continuously on the Redis clock.
--
-- KEYS[1]  string `<prefix>:{<key>}:tb` = `<tokens> <seconds> <microseconds>`: tokens left
--          (`%.17g`, may be fractional) at that Redis TIME, whose two parts are stored as TIME
--          returned them.
-- ARGV[1]  capacity: bucket size, the largest burst (number > 0).
-- ARGV[2]  refill_per_sec: tokens added per second (number > 0).
-- ARGV[3]  cost: tokens this call takes (number >= 0; 0 peeks without writing).
-- ARGV[4]  deadline_ms: Redis time (epoch ms) after which this call must change nothing, because
--          its caller has stopped waiting and was answered by its fault policy; 0 = none.
-- Returns  {allowed (1|0), remaining_micro, reset_at_ms, retry_after_ms, now_us}, all integers;
--          remaining_micro = tokens left in millionths, rounded down (Redis truncates Lua
--          numbers in replies to integers, so fractions travel scaled); now_us = Redis TIME in
--          microseconds (the caller learns the Redis clock from it). Past deadline_ms,
--          {-1, 0, 0, 0, now_us} and nothing read or written.
--
-- A missing key is a full bucket, so the key only has to live until the bucket would be full
-- again: one SET ... PX writes the state and exactly that TTL.
--
-- A stored time after TIME means the Redis clock stepped back (a failover to a host behind, an
-- NTP step). That state is taken as counted now: no tokens for the negative elapsed time, and
-- refill resumes from this call rather than from when the clock passes the stored time again,
-- which would lock the bucket out for the size of the step. Counted calls write the rebased time
-- even when rejected, so refill also resumes for keys that only see rejections; a peek writes
-- nothing and reports the stored level. A step back thus grants nothing extra; a later step
-- forward refills for its size, as it always did.
local time = redis.call('TIME')
local now_us = time[1] * 1000000 + time[2]
-- Past its deadline the call is skipped before any read or write: a Redis resuming from a pause
-- would otherwise count, for callers long since answered, every call waiting in its socket.
local deadline_ms = tonumber(ARGV[4]) or 0
if deadline_ms > 0 and now_us > deadline_ms * 1000 then return {-1, 0, 0, 0, now_us} end
local capacity = tonumber(ARGV[1])
local refill_per_sec = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
-- Refill arithmetic is in doubles; allow for their rounding so an exactly refilled token counts.
-- Relative to the bucket's size, as the rounding is: a fixed allowance would admit any cost below
-- it from an empty bucket (a bucket of 2e-9 tokens admitting every call of 1e-9).
local epsilon = capacity * 1e-14
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)

local tokens = capacity
local sec, usec = time[1], time[2]
local stepped_back = false
local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'table' then
  -- WRONGTYPE: a hash {tokens, ts (epoch us)} left by the layout before this one (a rolling
  -- upgrade). Rewritten in this layout with its TTL, so the bucket keeps its level.
  local old = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
  local old_ttl_ms = redis.call('PTTL', KEYS[1])
  redis.call('DEL', KEYS[1])
  stored = false
  if old[1] and old[2] and old_ttl_ms > 0 then
    local old_ts = tonumber(old[2])
    local old_sec = math.floor(old_ts / 1000000)
    stored = old[1] .. ' ' .. string.format('%.0f', old_sec) .. ' ' .. string.format('%.0f', old_ts - old_sec * 1000000)
    redis.call('SET', KEYS[1], stored, 'PX', old_ttl_ms)
  end
end
if stored then
  local stored_tokens, stored_sec, stored_usec = string.match(stored, '^(%S+) (%d+) (%d+)$')
  tokens = tonumber(stored_tokens)
  local elapsed_us = (sec - stored_sec) * 1000000 + (usec - stored_usec)
  if elapsed_us > 0 then
    tokens = tokens + elapsed_us * refill_per_sec / 1000000
    if tokens > capacity then tokens = capacity end
  elseif elapsed_us < 0 then
    stepped_back = true
  end
end

-- Millionths of a token fit a double exactly below 2^53; beyond that (capacity > ~9e9) the
-- integer reply would overflow, so it is sent as decimal text instead.
local function micro(amount)
  if amount < 0 then amount = 0 end
  local scaled = math.floor(amount * 1000000 + epsilon)
  if scaled >= 9007199254740992 then return string.format('%.0f', scaled) end
  return scaled
end

local function until_full_ms()
  if capacity - tokens > epsilon then return math.ceil((capacity - tokens) * 1000 / refill_per_sec) end
  return 0
end

local function store(full_ms)
  local ttl_ms = full_ms
  if ttl_ms < 1 then ttl_ms = 1 end
  -- Past 1e14 a Lua number is passed to Redis in exponent notation, which PX refuses.
  if ttl_ms >= 1e14 then ttl_ms = string.format('%.0f', ttl_ms) end
  redis.call('SET', KEYS[1], string.format('%.17g', tokens) .. ' ' .. sec .. ' ' .. usec, 'PX', ttl_ms)
end

if tokens + epsilon < cost then
  local retry_ms = math.ceil((cost - tokens) * 1000 / refill_per_sec)
  if retry_ms < 1 then retry_ms = 1 end
  if stepped_back then store(until_full_ms()) end
  return {0, micro(tokens), now_ms + math.ceil((capacity - tokens) * 1000 / refill_per_sec), retry_ms, now_us}
end

if cost > 0 then
  tokens = tokens - cost
  if tokens < 0 then tokens = 0 end
end
local full_ms = until_full_ms()
if cost > 0 then store(full_ms) end
return {1, micro(tokens), now_ms + full_ms, 0, now_us}
