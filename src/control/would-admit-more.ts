import type { UsageRates } from './child-ledger.js';

/** A ratio from a partial sum may let a reporter's hosts admit this much more than they do now (noise), no more. */
const PARTIAL_SLACK = 0.05;
/**
 * ... or this many standard deviations of the admitted share's sampling noise, when more: a window
 * of n calls each dropped with probability r admits a share with deviation √(r(1−r)/n), 0.029 for
 * 300 calls at r = 0.5, more than 5% of it.
 */
const PARTIAL_NOISE_Z = 3;

/**
 * Whether `dropRatio` would let a reporter's hosts admit more of a bucket than they do now (by
 * more than PARTIAL_SLACK, or than the sampling noise of the share they admit over `calls`
 * offered calls). Admitted minus would-drop is what the hosts' ratio lets through, so a shadow
 * bucket compares like an enforced one. A reporter that drops nothing (a new host, no directive
 * yet) is never loosened: any ratio asks at least as much as it applies.
 *
 * Used where a ratio may come from a sum that lacks part of the fleet (a controller regathering
 * its children, an aggregator's cached directive from a forward without a host that is back): such
 * a ratio is a lower bound, sent where it tightens and withheld where it would undo a ratio in force.
 */
export function wouldAdmitMore(dropRatio: number, usage: UsageRates, calls: number): boolean {
  if (!(usage.offeredRps > 0)) return false;
  const admittedNow = Math.min(1, Math.max(0, usage.admittedRps - usage.wouldDropRps) / usage.offeredRps);
  const noise = PARTIAL_NOISE_Z * Math.sqrt((admittedNow * (1 - admittedNow)) / Math.max(1, calls));
  return 1 - dropRatio > Math.max(admittedNow * (1 + PARTIAL_SLACK), admittedNow + noise);
}
