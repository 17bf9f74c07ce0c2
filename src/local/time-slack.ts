/**
 * Admission tolerance of the local limiters, in milliseconds of refill.
 *
 * Epoch times are around 1.7e12 ms, where one double step is about 0.24 µs, so "wait exactly
 * `retryAfterMs`, then retry" can land a fraction of a microsecond short of the instant the tokens
 * are due. A call is therefore admitted if its tokens would be due within this slack. The
 * shortfall is kept as debt (state may dip a hair below empty) and repaid by later refill, so the
 * tolerance never adds admissions over the long run.
 */
export const TIME_SLACK_MS = 0.001;
