import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { LimitsConfig } from '../config/limits-config.js';
import { parseLimitsConfig } from '../config/limits-config.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { compileRateLimits } from '../envoy/descriptor-rules.js';
import { limitsFromRateLimits } from '../envoy/envoy-limits.js';
import { loadRateLimitConfig } from '../envoy/ratelimit-config.js';
import { type FlagSpec, type FlagValues, stringFlag, usageError } from './command-line.js';

/**
 * What the controller's `--config` holds: Spillway's limits file, or envoyproxy/ratelimit's YAML
 * (a file or a directory of them), compiled to the same bucket keys and templates `spillway rls`
 * reports, so the one file Envoy's operators edit is the one the controller enforces.
 */
export type LimitsFormat = 'spillway' | 'envoy-ratelimit';

export const LIMITS_FORMAT_FLAG: Record<string, FlagSpec> = {
  'config-format': {
    type: 'string',
    valueName: 'auto|spillway|envoy-ratelimit',
    description:
      "what --config holds: Spillway's limits file, or envoyproxy/ratelimit's YAML (a file, or a directory " +
      'of them) as `spillway rls` reads it; auto: a directory, or a file with a top-level domain:, is the latter',
    defaultText: 'auto',
  },
};

export function limitsFormatFromFlags(values: FlagValues): LimitsFormat | 'auto' {
  const value = stringFlag(values, 'config-format') ?? 'auto';
  if (value === 'auto' || value === 'spillway' || value === 'envoy-ratelimit') return value;
  throw usageError(`--config-format must be one of auto, spillway, envoy-ratelimit, got '${value}'`, {
    flag: 'config-format',
  });
}

export interface LimitsSource {
  format: LimitsFormat;
  /** What was read (every file's name and text): equal text means nothing to reload. */
  text: string;
  /** The limits; throws ERR_SPILLWAY_INVALID_CONFIG with the file, line and column. */
  parse(): LimitsConfig;
  /** What to give watchFile (which watches its directory): a path inside `path` when that is a directory. */
  watchPath: string;
}

/** Read `path` in `format` (detected when `auto`). Unreadable files are ERR_SPILLWAY_INVALID_CONFIG. */
export async function readLimitsSource(path: string, format: LimitsFormat | 'auto'): Promise<LimitsSource> {
  let isDirectory = false;
  try {
    isDirectory = (await stat(path)).isDirectory();
  } catch {
    // Left to the read below, which names the error.
  }
  if (format === 'envoy-ratelimit' || (format === 'auto' && isDirectory)) return readEnvoy(path, isDirectory);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw new SpillwayError(
      ErrorCode.InvalidConfig,
      `${path}: cannot read limits file: ${(error as Error).message}`,
      { file: path },
      { cause: error },
    );
  }
  if (format === 'auto' && /^domain\s*:/m.test(text)) return readEnvoy(path, false);
  return { format: 'spillway', text, parse: () => parseLimitsConfig(text, path), watchPath: path };
}

async function readEnvoy(path: string, isDirectory: boolean): Promise<LimitsSource> {
  const { domains, fingerprint } = await loadRateLimitConfig(path);
  return {
    format: 'envoy-ratelimit',
    text: fingerprint,
    parse: () => limitsFromRateLimits(compileRateLimits(domains)),
    watchPath: isDirectory ? join(path, 'ratelimit.yaml') : path,
  };
}
