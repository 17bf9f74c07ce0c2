-- Sliding window log: one sorted-set member per admitted cost unit, scored by Redis time.
--
-- KEYS[1]  sorted set `<prefix>:{<key>}:sl`; member = `<time_us>-<sequence>`, score = time_us.
-- KEYS[2]  string `<prefix>:{<key>}:sl:seq`; per-key sequence that makes every member unique.
-- ARGV[1]  limit: cost admitted in any window_ms span (integer > 0).
-- ARGV[2]  window_ms: window length in milliseconds (integer > 0).
-- ARGV[3]  cost: members to add (integer >= 0; 0 peeks without writing).
-- Returns  {allowed (1|0), remaining, reset_at_ms, retry_after_ms}, all integers.
--
-- Trim, count and add run in this one script, so concurrent callers cannot both see room for the
-- last slot. Members must be unique: the naive `ZADD key now now` collapses requests that share a
-- millisecond into one member and lets same-millisecond bursts through. An entry scored s counts
-- while now_us - s < window_us. Both keys get PEXPIRE window_ms whenever a member is added; the
-- newest member is never older than the TTL, so an expired set held nothing that still counted.
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now_us / 1000)
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local window_us = window_ms * 1000
-- Lua 5.1 prints numbers with 14 significant digits; microsecond epochs need 16.
local now_us_text = time[1] .. string.format('%06d', tonumber(time[2]))

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now_us - window_us))
local count = redis.call('ZCARD', KEYS[1])

-- When the newest entry has left the window, the log is empty again (microsecond scores,
-- rounded up to whole milliseconds so a caller never retries a moment too early).
local function reset_at(extra_newest_us)
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local newest_us = extra_newest_us
  if newest[2] ~= nil and tonumber(newest[2]) > newest_us then newest_us = tonumber(newest[2]) end
  if newest_us < 0 then return now_ms end
  return math.ceil((newest_us + window_us) / 1000)
end

if count + cost > limit then
  -- Room for `cost` appears when the (count + cost - limit)-th oldest entry leaves the window.
  local nth = count + cost - limit
  local entry = redis.call('ZRANGE', KEYS[1], nth - 1, nth - 1, 'WITHSCORES')
  local retry_ms = math.ceil((tonumber(entry[2]) + window_us - now_us) / 1000)
  if retry_ms < 1 then retry_ms = 1 end
  return {0, limit - count, reset_at(-1), retry_ms}
end

if cost > 0 then
  local last = redis.call('INCRBY', KEYS[2], cost)
  local first = last - cost + 1
  -- ZADD in chunks: Lua's unpack() has a bounded stack.
  local chunk = {}
  for seq = first, last do
    chunk[#chunk + 1] = now_us_text
    chunk[#chunk + 1] = now_us_text .. '-' .. string.format('%.0f', seq)
    if #chunk >= 1000 then
      redis.call('ZADD', KEYS[1], unpack(chunk))
      chunk = {}
    end
  end
  if #chunk > 0 then redis.call('ZADD', KEYS[1], unpack(chunk)) end
  redis.call('PEXPIRE', KEYS[1], window_ms)
  redis.call('PEXPIRE', KEYS[2], window_ms)
  count = count + cost
  return {1, limit - count, reset_at(now_us), 0}
end
return {1, limit - count, reset_at(-1), 0}
