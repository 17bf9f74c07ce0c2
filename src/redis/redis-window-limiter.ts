import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertPositiveInteger } from '../core/validate.js';

/**
 * Checks `limit` and `windowMs` of the window limiters. Both are whole numbers: counts are whole
 * requests and Redis TIME windows are aligned in milliseconds. `limit * windowMs` must stay a safe
 * integer because the sliding counter compares its weighted estimate multiplied by `windowMs`.
 */
export function assertWindowOptions(limit: unknown, windowMs: unknown): asserts limit is number {
  assertPositiveInteger('limit', limit);
  assertPositiveInteger('windowMs', windowMs);
  if (!Number.isSafeInteger(limit * (windowMs as number))) {
    throw new SpillwayError(
      ErrorCode.InvalidLimit,
      `limit * windowMs must be at most ${Number.MAX_SAFE_INTEGER}, got ${limit} * ${String(windowMs)}`,
      { field: 'limit' },
    );
  }
}
