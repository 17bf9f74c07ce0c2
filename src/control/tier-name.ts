import { Tier } from '../gen/spillway/v1/control_pb.js';

export type TierName = 'unspecified' | 'host' | 'aggregator' | 'controller';

/** Every value `tierName` returns: a label's whole range, to export zeros before the first count. */
export const TIER_NAMES: readonly TierName[] = ['host', 'aggregator', 'controller', 'unspecified'];

/**
 * A reporter's tier as a counter key or metric label. The wire may carry any enum number; every
 * number outside the three tiers is `unspecified`, so a hostile reporter cannot add label values.
 */
export function tierName(tier: Tier): TierName {
  switch (tier) {
    case Tier.HOST:
      return 'host';
    case Tier.AGGREGATOR:
      return 'aggregator';
    case Tier.CONTROLLER:
      return 'controller';
    default:
      return 'unspecified';
  }
}
