import { Buffer } from 'node:buffer';
import type { Random } from '../core/clock.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { assertKey } from '../core/validate.js';
import { Bucket, type BucketContext } from './bucket-handle.js';

/** Key of the shared handle that decides calls for new keys once the table is full. */
export const OVERFLOW_BUCKET_KEY = '(overflow)';

/**
 * The buckets of one limiter, bounded by `maxBuckets` so hostile keys cannot grow memory.
 *
 * When the table is full:
 * - a by-key call for a new key is decided by one shared overflow handle that never drops, is
 *   never reported and is counted (fail open: a flood of random keys must neither fail requests
 *   nor evict the buckets that carry real limits);
 * - `pin()` (what `bucket(key)` calls) first expires idle buckets, then refuses with
 *   ERR_SPILLWAY_CAPACITY_EXCEEDED: holding more handles than `maxBuckets` is a configuration error.
 *
 * Buckets resolved by key expire after `idleExpiryMs` without traffic, pending counts or a fresh
 * directive; pinned buckets never expire, so a handle a caller holds keeps working.
 */
export class BucketTable {
  readonly map = new Map<string, Bucket>();
  readonly overflow: Bucket;
  readonly maxBuckets: number;
  readonly maxKeyLength: number;
  readonly #random: Random;
  readonly #context: BucketContext;
  expired = 0;

  constructor(maxBuckets: number, maxKeyLength: number, random: Random, context: BucketContext) {
    this.maxBuckets = maxBuckets;
    this.maxKeyLength = maxKeyLength;
    this.#random = random;
    this.#context = context;
    this.overflow = new Bucket(OVERFLOW_BUCKET_KEY, random, context, context.clock.nowMs());
    this.overflow.shadow = false;
  }

  /** The by-key miss path: validate, then create, or fall back to the overflow handle when full. */
  resolveForCall(key: string): Bucket {
    const existing = this.map.get(key);
    if (existing) return existing;
    this.#validate(key);
    if (this.map.size >= this.maxBuckets) return this.overflow;
    return this.#create(key);
  }

  /** Resolve for a caller that will hold the handle: the bucket never expires. */
  pin(key: string): Bucket {
    const existing = this.map.get(key);
    if (existing) {
      existing.pinned = true;
      return existing;
    }
    this.#validate(key);
    if (this.map.size >= this.maxBuckets) this.sweep(this.#context.clock.nowMs(), 0);
    if (this.map.size >= this.maxBuckets) {
      throw new SpillwayError(
        ErrorCode.CapacityExceeded,
        `the global limiter holds ${this.map.size} buckets, its maximum; raise maxBuckets or resolve fewer keys`,
        { maxBuckets: this.maxBuckets },
      );
    }
    const bucket = this.#create(key);
    bucket.pinned = true;
    return bucket;
  }

  /** Drop unpinned buckets idle for `idleExpiryMs` that hold nothing worth keeping. Returns how many. */
  sweep(nowMs: number, idleExpiryMs: number): number {
    let removed = 0;
    for (const [key, bucket] of this.map) {
      if (
        !bucket.pinned &&
        !bucket.hasPending &&
        bucket.windowOffered === 0 &&
        nowMs - bucket.lastActiveMs >= idleExpiryMs &&
        !bucket.directiveFresh(nowMs)
      ) {
        this.map.delete(key);
        removed++;
      }
    }
    this.expired += removed;
    return removed;
  }

  #create(key: string): Bucket {
    const bucket = new Bucket(key, this.#random, this.#context, this.#context.clock.nowMs());
    this.map.set(key, bucket);
    return bucket;
  }

  #validate(key: string): void {
    assertKey(key, this.maxKeyLength);
    // The wire bounds keys in bytes; a short string of wide characters can still be too long.
    const bytes = Buffer.byteLength(key, 'utf8');
    if (bytes > this.maxKeyLength) {
      throw new SpillwayError(
        ErrorCode.InvalidKey,
        `key is ${bytes} bytes in UTF-8, over the maximum ${this.maxKeyLength}`,
        { field: 'key', maxLength: this.maxKeyLength },
      );
    }
  }
}
