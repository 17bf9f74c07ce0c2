import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { RedisScriptClient } from './redis-script-client.js';

/** A Lua script read from `src/redis/scripts/` (copied beside the compiled code in `dist/`). */
export interface LuaScript {
  readonly name: string;
  readonly source: string;
  /** SHA1 of `source` as Redis computes it for `EVALSHA`; pinned by test/redis/scripts.test.ts. */
  readonly sha: string;
}

/** Reads a script at module load, relative to this module, so it works from `src/` and `dist/`. */
export function loadLuaScript(name: string): LuaScript {
  const source = readFileSync(new URL(`./scripts/${name}.lua`, import.meta.url), 'utf8');
  const sha = createHash('sha1').update(source).digest('hex');
  return { name, source, sha };
}

/** Whether an error is Redis saying the script is not in its cache (restart, failover, SCRIPT FLUSH). */
export function isNoScriptError(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}

/**
 * `EVALSHA` first (only the hash crosses the wire); on `NOSCRIPT`, `EVAL` with the source, which
 * also puts the script back in the server's cache. `onReload` counts those fallbacks.
 *
 * `signal` (an AbortSignal or anything with `aborted`): once aborted — the caller has already been
 * answered, e.g. by its timeout — a NOSCRIPT error is rethrown instead of being followed by an
 * EVAL, which would count a call nobody waits for any more.
 */
export async function runLuaScript(
  client: RedisScriptClient,
  script: LuaScript,
  keys: string[],
  args: (string | number)[],
  onReload: () => void,
  signal?: { readonly aborted: boolean },
): Promise<unknown> {
  try {
    return await client.evalsha(script.sha, keys, args);
  } catch (error) {
    if (!isNoScriptError(error) || signal?.aborted) throw error;
    onReload();
    return client.eval(script.source, keys, args);
  }
}
