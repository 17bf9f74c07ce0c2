/**
 * The bounds of one usage report, on both sides of the wire. A receiver's bound (what an aggregator
 * or controller accepts) and a sender's default (what a host puts in one report) are different
 * numbers on purpose: a sender stays well under what any receiver takes, so a receiver configured
 * tighter than its default still hears from hosts that run theirs.
 */

/** Buckets a receiver accepts in one report by default (`ReportLimits.maxBucketsPerReport`). */
export const RECEIVER_MAX_BUCKETS_PER_REPORT = 10_000;

/** Buckets a host puts in one report by default (`GlobalLimiterOptions.maxBucketsPerReport`). */
export const SENDER_MAX_BUCKETS_PER_REPORT = 5_000;

/** Longest reporter id, zone, region or bucket key a receiver accepts, in UTF-8 bytes. */
export const RECEIVER_MAX_KEY_BYTES = 256;

/**
 * Fastest rate a report may claim for a bucket (count over window): a trillion a second, far above
 * any fleet. A finite count over a short window can otherwise be an infinite rate, which turns the
 * receiver's sums into `Infinity` and then `NaN` (a drop ratio of 1, then 0, for everyone).
 */
export const RECEIVER_MAX_RATE_PER_SEC = 1e12;

/**
 * The longest window one report may cover, on both sides. Receivers refuse a longer one, so
 * senders never send one: a host whose reports failed for a while, or whose interval is long and
 * jittered, scales what it carries over into this window instead. Without the same bound on both
 * sides, a host past it would be refused for good.
 */
export const MAX_REPORT_WINDOW_MS = 60_000;

/**
 * Receivers refuse a report whose `acknowledged_by` is longer than this (as they do a reporter id
 * that long): the protocol's bound on ids.
 */
export const MAX_ACKNOWLEDGED_BY_BYTES = 256;
