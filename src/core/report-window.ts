/**
 * The longest window one usage report may cover. Receivers (aggregators, controllers) refuse a
 * longer one, so reporters never send one: a host whose reports failed for a while, or whose
 * interval is long and jittered, scales what it carries over into this window instead. Without
 * the same bound on both sides, a host past it would be refused for good.
 */
export const MAX_REPORT_WINDOW_MS = 60_000;
