-- Sliding window counter: two fixed windows, the previous one weighted by how much of it the
-- sliding window still overlaps.
--
-- KEYS[1]  hash `<prefix>:{<key>}:sc`; fields `w` = start of the current window (epoch ms),
--          `c` = cost admitted in window w, `p` = cost admitted in window w - window_ms.
-- ARGV[1]  limit: cost admitted per window (integer > 0).
-- ARGV[2]  window_ms: window length in milliseconds (integer > 0).
-- ARGV[3]  cost: cost of this call (integer >= 0; 0 peeks without writing).
-- ARGV[4]  deadline_ms: Redis time (epoch ms) after which this call must change nothing, because
--          its caller has stopped waiting and was answered by its fault policy; 0 = none.
-- Returns  {allowed (1|0), remaining, reset_at_ms, retry_after_ms, now_us}, all integers, now_us
--          being Redis TIME in microseconds (the caller learns the Redis clock from it); past
--          deadline_ms, {-1, 0, 0, 0, now_us} and nothing read or written.
--
-- estimate = previous * (window_ms - elapsed_ms) / window_ms + current. The comparison is done
-- multiplied through by window_ms so it is exact integer arithmetic (doubles hold integers to
-- 2^53). The error bound of this estimate is derived in docs/redis-limiters.md. The first write
-- of a window rewrites the hash and PEXPIREATs it to the end of the next window (after which its
-- count no longer weighs on anything); later writes in the window only HINCRBY `c`.
--
-- A stored window after the current one means the Redis clock stepped back (a failover to a host
-- behind, an NTP step). Its counts are taken as this window's rather than dropped, which would
-- start a fresh window and admit a full limit again: both of them, `c` and `p`, since `p`'s
-- window (w - window_ms) is itself no earlier than the current one; weighing `p` as the previous
-- window's would discount counts of this very window. Counts are only ever moved to a window no
-- earlier than their real one (they weigh as long or longer, so the bound in
-- docs/redis-limiters.md still holds); they may weigh longer by less than one window and less than
-- the step. The real previous window's count was overwritten and weighs nothing. Counted calls write the moved state even when rejected, so the next
-- window weighs it as the previous one; a peek writes nothing.
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
local elapsed = now_ms - window_start
local overlap = window_ms - elapsed

local stored = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
local stored_start = tonumber(stored[1])
local current, previous = 0, 0
if stored_start and stored_start > window_start then
  current = (tonumber(stored[2]) or 0) + (tonumber(stored[3]) or 0)
  stored_start = window_start
  if cost > 0 then
    redis.call('HSET', KEYS[1], 'w', window_start, 'c', current, 'p', previous)
    redis.call('PEXPIREAT', KEYS[1], window_start + 2 * window_ms)
  end
elseif stored_start == window_start then
  current = tonumber(stored[2]) or 0
  previous = tonumber(stored[3]) or 0
elseif stored_start == window_start - window_ms then
  previous = tonumber(stored[2]) or 0
end
local weighted = previous * overlap

if weighted + (current + cost) * window_ms > limit * window_ms then
  local retry_ms
  if current + cost <= limit then
    -- Later in this window: the previous window's weight falls until the estimate has room.
    retry_ms = window_ms - math.floor((limit - current - cost) * window_ms / previous) - elapsed
  else
    -- Next window: this window's count becomes the weighted previous one.
    local wait_until = window_ms - math.floor((limit - cost) * window_ms / current)
    if wait_until < 0 then wait_until = 0 end
    retry_ms = overlap + wait_until
  end
  if retry_ms < 1 then retry_ms = 1 end
  local scaled = limit * window_ms - weighted - current * window_ms
  local remaining = 0
  if scaled > 0 then remaining = math.floor(scaled / window_ms) end
  local reset_at_ms = now_ms
  if current > 0 then reset_at_ms = window_start + 2 * window_ms
  elseif previous > 0 then reset_at_ms = window_start + window_ms end
  return {0, remaining, reset_at_ms, retry_ms, now_us}
end

if cost > 0 then
  if stored_start == window_start then
    redis.call('HINCRBY', KEYS[1], 'c', cost)
  else
    redis.call('HSET', KEYS[1], 'w', window_start, 'c', cost, 'p', previous)
    redis.call('PEXPIREAT', KEYS[1], window_start + 2 * window_ms)
  end
  current = current + cost
end
local scaled = limit * window_ms - weighted - current * window_ms
local remaining = 0
if scaled > 0 then remaining = math.floor(scaled / window_ms) end
local reset_at_ms = now_ms
if current > 0 then reset_at_ms = window_start + 2 * window_ms
elseif previous > 0 then reset_at_ms = window_start + window_ms end
return {1, remaining, reset_at_ms, 0, now_us}
