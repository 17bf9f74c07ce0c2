/**
 * Where `spillway rls` counts: the global limiter in process (the default), our atomic Redis
 * scripts (a round trip per descriptor, exact counts across instances), or a local counter (exact,
 * per instance). Each is asked about one descriptor at a time; the service combines the answers.
 */
export interface WindowLimit {
  /** What the file (or the request) says: requests per unit of time. Never 0 here. */
  readonly requestsPerUnit: number;
  readonly unitSeconds: number;
  /** requests_per_unit / unit seconds. */
  readonly limitRps: number;
}

export interface DescriptorOutcome {
  /** Over its limit: OVER_LIMIT unless the rule is in shadow mode. */
  overLimit: boolean;
  /** `limit_remaining`: left in the window after this call (0 when over). */
  remaining: number;
  /** The backend could not decide (Redis down) and its fault policy did. */
  fault?: boolean;
}

export interface RlsBackend {
  readonly kind: 'global' | 'redis' | 'local';
  /**
   * Count `hits` (0: check only) against `limit` for bucket `key`. Synchronous for the in-process
   * backends, so a request costs no promise there.
   */
  check(key: string, limit: WindowLimit, hits: number): DescriptorOutcome | Promise<DescriptorOutcome>;
  /**
   * A request's own limit (`RateLimitDescriptor.limit`), which the control plane does not know:
   * the global backend applies it to the fleet-wide offered rate; the others count it as a rule.
   */
  checkOverride(
    key: string,
    limit: WindowLimit,
    hits: number,
  ): DescriptorOutcome | Promise<DescriptorOutcome>;
  close(): Promise<void>;
}
