/**
 * Errors with stable codes. Code strings are part of the public API: each has an entry in
 * docs/errors.md and never changes meaning. Messages may be improved; codes may not.
 */
export const ErrorCode = {
  /** A limit, window, capacity or rate is missing, non-finite, zero or negative where not allowed. */
  InvalidLimit: 'ERR_SPILLWAY_INVALID_LIMIT',
  /** A per-call cost is negative, non-finite or larger than the limit can ever admit. */
  InvalidCost: 'ERR_SPILLWAY_INVALID_COST',
  /** A key is empty, not a string, or longer than the configured maximum. */
  InvalidKey: 'ERR_SPILLWAY_INVALID_KEY',
  /** An option object has an unknown or ill-typed field. */
  InvalidOption: 'ERR_SPILLWAY_INVALID_OPTION',
  /** A configuration file could not be read, parsed or validated. */
  InvalidConfig: 'ERR_SPILLWAY_INVALID_CONFIG',
  /** A usage report failed validation (non-finite counts, oversized, too many buckets...). */
  InvalidReport: 'ERR_SPILLWAY_INVALID_REPORT',
  /** The store did not answer within the per-call timeout (thrown only where no policy applies). */
  StoreTimeout: 'ERR_SPILLWAY_STORE_TIMEOUT',
  /** The store answered with an error or is unreachable (thrown only where no policy applies). */
  StoreUnavailable: 'ERR_SPILLWAY_STORE_UNAVAILABLE',
  /** A bounded table (keys, buckets, hosts) is full and refused a new entry. */
  CapacityExceeded: 'ERR_SPILLWAY_CAPACITY_EXCEEDED',
  /** A command-line invocation was malformed. */
  InvalidUsage: 'ERR_SPILLWAY_INVALID_USAGE',
} as const;

export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

export class SpillwayError extends Error {
  readonly code: ErrorCode;
  /** Machine-readable context (the offending field, file and line...). */
  readonly details: Readonly<Record<string, unknown>> | undefined;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>, options?: ErrorOptions) {
    super(message, options);
    this.name = 'SpillwayError';
    this.code = code;
    this.details = details;
  }
}

export function isSpillwayError(error: unknown, code?: ErrorCode): error is SpillwayError {
  return error instanceof SpillwayError && (code === undefined || error.code === code);
}
