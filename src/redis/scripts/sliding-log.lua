-- Sliding window log: one sorted-set member per admitted cost unit, scored by Redis time.
--
-- KEYS[1]  sorted set `<prefix>:{<key>}:sl`; score = Redis time in epoch microseconds, member =
--          that time as text, or `<time_us>-<n>` for the further units of one call and for a
--          member whose time is already taken.
-- ARGV[1]  limit: cost admitted in any window_ms span (integer > 0).
-- ARGV[2]  window_ms: window length in milliseconds (integer > 0).
-- ARGV[3]  cost: members to add (integer >= 0; 0 peeks without writing).
-- ARGV[4]  deadline_ms: Redis time (epoch ms) after which this call must change nothing, because
--          its caller has stopped waiting and was answered by its fault policy; 0 = none.
-- Returns  {allowed (1|0), remaining, reset_at_ms, retry_after_ms, now_us}, all integers, now_us
--          being Redis TIME in microseconds (the caller learns the Redis clock from it); past
--          deadline_ms, {-1, 0, 0, 0, now_us} and nothing read or written.
--
-- Trim, count and add run in this one script, so concurrent callers cannot both see room for the
-- last slot. Members must be unique: the naive `ZADD key now now` with a millisecond clock
-- collapses requests that share a millisecond into one member and lets same-millisecond bursts
-- through. Scripts run one at a time and each takes over a microsecond, so the microsecond time
-- is unique per call; where it is not (a clock stepped back, a failover to a host behind), ZADD
-- reports fewer members added and the missing ones are retried with a `-<n>` suffix, so the
-- log never holds fewer members than it admitted. An entry scored s counts while
-- now_us - s < window_us. The key gets PEXPIRE window_ms whenever a member is added; the newest
-- member is never older than the TTL, so an expired set held nothing that still counted.
--
-- A newest score after TIME means the Redis clock stepped back (a failover to a host behind, an
-- NTP step) by at least the difference. Every score is moved back by that difference, so the
-- newest entry is scored now and the others keep their ages: entries scored ahead would otherwise
-- count, and lock the key out, for the whole step on top of the window. The step is at least
-- that long, so no entry leaves earlier than it would have without the step (nothing extra is
-- granted); it may leave later by the time between the newest entry and the step, at most one
-- window. The rewrite costs O(entries), only on a step; a peek makes it too.
local time = redis.call('TIME')
local now_us = time[1] * 1000000 + time[2]
-- Past its deadline the call is skipped before any read or write: a Redis resuming from a pause
-- would otherwise count, for callers long since answered, every call waiting in its socket.
local deadline_ms = tonumber(ARGV[4]) or 0
if deadline_ms > 0 and now_us > deadline_ms * 1000 then return {-1, 0, 0, 0, now_us} end
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local window_us = window_ms * 1000
-- Lua 5.1 prints numbers with 14 significant digits; microsecond epochs need 16.
local now_text = time[1] .. string.format('%06d', time[2])

local newest_entry = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if newest_entry[2] and tonumber(newest_entry[2]) > now_us then
  local shift_us = tonumber(newest_entry[2]) - now_us
  local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for first = 1, #entries, 1000 do
    local chunk = {}
    for i = first, math.min(first + 999, #entries), 2 do
      chunk[#chunk + 1] = string.format('%.0f', tonumber(entries[i + 1]) - shift_us)
      chunk[#chunk + 1] = entries[i]
    end
    redis.call('ZADD', KEYS[1], 'XX', unpack(chunk))
  end
  redis.call('PEXPIRE', KEYS[1], window_ms)
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now_us - window_us))
local count = redis.call('ZCARD', KEYS[1])

if count + cost > limit then
  -- Room for `cost` appears when the (count + cost - limit)-th oldest entry leaves the window;
  -- the log is empty again when the newest one has (rounded up to whole milliseconds, so a
  -- caller never retries a moment too early).
  local nth = count + cost - limit
  local entry = redis.call('ZRANGE', KEYS[1], nth - 1, nth - 1, 'WITHSCORES')
  local retry_ms = math.ceil((tonumber(entry[2]) + window_us - now_us) / 1000)
  if retry_ms < 1 then retry_ms = 1 end
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  return {0, limit - count, math.ceil((tonumber(newest[2]) + window_us) / 1000), retry_ms, now_us}
end

if cost == 0 then
  if count == 0 then return {1, limit, math.floor(now_us / 1000), 0, now_us} end
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  return {1, limit - count, math.ceil((tonumber(newest[2]) + window_us) / 1000), 0, now_us}
end

local missing = cost
local suffix = 0
if cost == 1 then
  missing = 1 - redis.call('ZADD', KEYS[1], now_text, now_text)
  suffix = 1
end
while missing > 0 do
  -- In chunks: Lua's unpack() has a bounded stack.
  local chunk = {}
  local n = missing
  if n > 500 then n = 500 end
  for _ = 1, n do
    chunk[#chunk + 1] = now_text
    if suffix == 0 then
      chunk[#chunk + 1] = now_text
    else
      chunk[#chunk + 1] = now_text .. '-' .. suffix
    end
    suffix = suffix + 1
  end
  missing = missing - redis.call('ZADD', KEYS[1], unpack(chunk))
end
redis.call('PEXPIRE', KEYS[1], window_ms)
-- The members just added are the newest (unless the clock stepped back): the log is empty again
-- when they leave.
return {1, limit - count - cost, math.ceil((now_us + window_us) / 1000), 0, now_us}
