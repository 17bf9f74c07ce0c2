import type { RedisScriptClient } from '../../src/redis/index.js';

export interface RecordedCall {
  command: 'evalsha' | 'eval' | 'scriptLoad';
  keys: string[];
  args: (string | number)[];
}

/**
 * A fake RedisScriptClient for tests that need no server: records every command and answers with
 * `respond` (which may return a never-settling promise to simulate a hung Redis).
 */
export function createRecordingRedisClient(
  respond: (call: RecordedCall) => Promise<unknown> = async () => [1, 0, 0, 0],
): RedisScriptClient & { calls: RecordedCall[] } {
  const calls: RecordedCall[] = [];
  const record = (call: RecordedCall) => {
    calls.push(call);
    return respond(call);
  };
  return {
    calls,
    evalsha: (_sha, keys, args) => record({ command: 'evalsha', keys, args }),
    eval: (_script, keys, args) => record({ command: 'eval', keys, args }),
    scriptLoad: async () => {
      calls.push({ command: 'scriptLoad', keys: [], args: [] });
      return '';
    },
  };
}

/** A promise whose settlement the test controls. */
export function deferred<T>(): {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(error: unknown): void;
} {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}
