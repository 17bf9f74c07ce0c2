import type { Cluster, Redis } from 'ioredis';

/**
 * The three commands the Redis limiters need, so a client library other than ioredis (node-redis,
 * a test fake) can be plugged in with a few lines. Keys and arguments are passed separately because
 * Redis Cluster routes a script by its keys.
 */
export interface RedisScriptClient {
  evalsha(sha: string, keys: string[], args: (string | number)[]): Promise<unknown>;
  eval(script: string, keys: string[], args: (string | number)[]): Promise<unknown>;
  /** Optional: cache a script on the server ahead of use; resolves with its SHA1. */
  scriptLoad?(script: string): Promise<string>;
}

/**
 * Wraps an ioredis `Redis` or `Cluster`. A Cluster routes EVALSHA/EVAL by the first key, which is
 * why every key of one limiter call shares a `{hash tag}`. `scriptLoad` is offered for a single
 * node only: on a Cluster it would reach one random node, and the EVALSHA-then-EVAL fallback loads
 * scripts on each node anyway.
 */
export function ioredisAdapter(client: Redis | Cluster): RedisScriptClient {
  const adapter: RedisScriptClient = {
    evalsha: (sha, keys, args) => client.evalsha(sha, keys.length, ...keys, ...args),
    eval: (script, keys, args) => client.eval(script, keys.length, ...keys, ...args),
  };
  if (!client.isCluster) {
    const single = client as Redis;
    adapter.scriptLoad = async (script) => String(await single.script('LOAD', script));
  }
  return adapter;
}
