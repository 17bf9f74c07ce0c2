-- Fixed window counter.
--
-- KEYS[1]  string `<prefix>:{<key>}:fw`: cost admitted in the current window, stored positive in
--          odd-numbered windows (window start / window_ms odd) and negated in even-numbered ones.
-- ARGV[1]  limit: cost admitted per window (integer > 0).
-- ARGV[2]  window_ms: window length in milliseconds (integer > 0).
-- ARGV[3]  cost: cost of this call (integer >= 0; 0 peeks without writing).
-- ARGV[4]  deadline_ms: Redis time (epoch ms) after which this call must change nothing, because
--          its caller has stopped waiting and was answered by its fault policy; 0 = none.
-- Returns  {allowed (1|0), remaining, reset_at_ms, retry_after_ms, now_us}, all integers, now_us
--          being Redis TIME in microseconds (the caller learns the Redis clock from it); past
--          deadline_ms, {-1, 0, 0, 0, now_us} and nothing read or written.
--
-- Windows are aligned to epoch multiples of window_ms on the Redis clock (TIME), never the
-- caller's. The first write of a window SETs the count and PEXPIREATs the key to the window's
-- end, in this one script, so the key never exists without a TTL; later writes only INCRBY.
-- The sign tells the window a count belongs to: Redis checks expiry against the time the script
-- started (and keeps a key alive through its expiry millisecond), so a key of the previous window
-- can still be visible in the first moment of the next. Its sign is then the wrong one, and it is
-- restarted instead of counted. Cheaper than a hash with the window start: GET, then INCRBY.
--
-- A count with the wrong sign may instead be a later window's, when the Redis clock stepped back
-- (a failover to a host behind, an NTP step): its key then expires after this window ends (keys
-- expire at their window's end), where a previous window's expires at this window's start; the
-- test is halfway between, so a millisecond of rounding between TIME and PTTL cannot confuse
-- them. Only then is PTTL read (an O(1) read on the rare wrong-sign path). The later window's count is
-- carried into this window instead of restarted, which would admit a full limit again; counted
-- calls rewrite it with this window's sign and end even when rejected. A later window's count
-- with the right sign (a step of an even number of windows) is counted as this window's, and
-- carried once more in the next. Either way nothing extra is admitted, and the key rejects for
-- less than the step, at most two windows.
local time = redis.call('TIME')
local now_us = time[1] * 1000000 + time[2]
-- Past its deadline the call is skipped before any read or write: a Redis resuming from a pause
-- would otherwise count, for callers long since answered, every call waiting in its socket.
local deadline_ms = tonumber(ARGV[4]) or 0
if deadline_ms > 0 and now_us > deadline_ms * 1000 then return {-1, 0, 0, 0, now_us} end
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local window_start = now_ms - now_ms % window_ms
local reset_at_ms = window_start + window_ms
local sign = 1
if (window_start / window_ms) % 2 == 0 then sign = -1 end

local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'table' then
  -- WRONGTYPE: a hash {w, c} left by the layout before this one (a rolling upgrade). Carry its
  -- count over if it is this window's, so the upgrade admits nothing extra.
  local old = redis.call('HMGET', KEYS[1], 'w', 'c')
  redis.call('DEL', KEYS[1])
  stored = nil
  if tonumber(old[1]) == window_start and (tonumber(old[2]) or 0) > 0 then
    stored = sign * tonumber(old[2])
    redis.call('SET', KEYS[1], stored)
    redis.call('PEXPIREAT', KEYS[1], reset_at_ms)
  end
end
stored = tonumber(stored)
local count = 0
if stored and stored * sign > 0 then
  count = stored * sign
elseif stored and stored ~= 0 and now_ms + redis.call('PTTL', KEYS[1]) > reset_at_ms + window_ms / 2 then
  count = -stored * sign
  if cost > 0 then
    redis.call('SET', KEYS[1], sign * count)
    redis.call('PEXPIREAT', KEYS[1], reset_at_ms)
  end
end

if count + cost > limit then
  return {0, limit - count, reset_at_ms, reset_at_ms - now_ms, now_us}
end

if cost > 0 then
  if count > 0 then
    redis.call('INCRBY', KEYS[1], sign * cost)
  else
    redis.call('SET', KEYS[1], sign * cost)
    redis.call('PEXPIREAT', KEYS[1], reset_at_ms)
  end
  count = count + cost
end
return {1, limit - count, reset_at_ms, 0, now_us}
