// `spillway/redis`: limiters whose state lives in Redis, each decision one atomic Lua script on the
// Redis clock. See docs/redis-limiters.md.
export type { LuaScript } from './lua-script.js';
export { isNoScriptError, loadLuaScript, runLuaScript } from './lua-script.js';
export {
  createRedisFixedWindow,
  fixedWindowScript,
  type RedisFixedWindowOptions,
} from './redis-fixed-window.js';
export { redisKey } from './redis-key.js';
export type {
  FailPolicy,
  RedisLimiter,
  RedisLimiterCommonOptions,
  RedisLimiterStats,
} from './redis-limiter.js';
export { FAIL_CLOSED_RETRY_AFTER_MS } from './redis-limiter.js';
export type { RedisScriptClient } from './redis-script-client.js';
export { ioredisAdapter } from './redis-script-client.js';
export {
  createRedisSlidingCounter,
  type RedisSlidingCounterOptions,
  slidingCounterScript,
} from './redis-sliding-counter.js';
export {
  createRedisSlidingLog,
  MAX_SLIDING_LOG_LIMIT,
  type RedisSlidingLogOptions,
  slidingLogScript,
} from './redis-sliding-log.js';
export {
  createRedisTokenBucket,
  type RedisTokenBucketOptions,
  tokenBucketScript,
} from './redis-token-bucket.js';
