import { Redis } from 'ioredis';
import type { RedisServer } from '../helpers/redis-server.js';

/**
 * An ioredis client for a test server, configured as docs/redis-limiters.md recommends: fail fast
 * while disconnected instead of queueing, so the limiter's own timeout is rarely the only guard.
 * Resolves once the connection is ready.
 */
export async function connectRedis(server: RedisServer): Promise<Redis> {
  const client = new Redis({
    host: server.host,
    port: server.port,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    lazyConnect: true,
  });
  await client.connect();
  return client;
}

/** Redis server time in epoch milliseconds (what the limiter scripts use). */
export async function redisTimeMs(client: Redis): Promise<number> {
  const [seconds, micros] = await client.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

/** Resolves after `ms` of real time. Used only where real Redis time must pass (windows, refills). */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
