/**
 * Weighted max-min fair shares ("water-filling"): `capacity` divided among claimants so that no
 * claimant gets more than it claims, and none can get more by claiming more. With a water level
 * `level`, claimant i gets `min(demand_i, weight_i × level)`; the level is the highest one whose
 * shares fit the capacity. A claimant under the level gets its whole demand; every claimant over
 * it gets the same share per unit of weight, whatever it claimed.
 *
 * That last property is why the control plane allocates with it: a child that overstates its
 * demand (a lying or broken reporter) raises only its own share, and only up to the level, while
 * every honest child under the level keeps all it asked for. The same division serves nested
 * limits, where a parent's limit is the capacity and its children's demands (each already bounded
 * by the child's own limit) are the claims.
 *
 * When the demands fit (their sum is at most the capacity) every claimant gets its demand and the
 * level is Infinity. Cost: O(n log n) for the sort; no allocation when `order` is passed in.
 */
export interface FairShareInput {
  /** What each claimant asks for (units per second); non-finite or negative counts as 0. */
  readonly demands: ArrayLike<number>;
  /** Each claimant's weight (> 0); absent: 1 each. Non-finite or non-positive counts as 1. */
  readonly weights?: ArrayLike<number>;
  /** What there is to divide; non-finite or negative counts as 0. */
  readonly capacity: number;
}

/**
 * Writes each claimant's share into `shares` (same length as the demands) and returns the water
 * level (share per unit of weight of every claimant held at it; Infinity when nobody is held).
 */
export function fairShares(input: FairShareInput, shares: number[] | Float64Array): number {
  const count = input.demands.length;
  const capacity = clean(input.capacity);
  let total = 0;
  for (let i = 0; i < count; i++) total += clean(input.demands[i]!);
  if (total <= capacity) {
    for (let i = 0; i < count; i++) shares[i] = clean(input.demands[i]!);
    return Number.POSITIVE_INFINITY;
  }
  const level = waterLevel(input, capacity);
  for (let i = 0; i < count; i++) {
    shares[i] = Math.min(clean(input.demands[i]!), weightOf(input, i) * level);
  }
  return level;
}

/**
 * The level at which `sum(min(demand_i, weight_i × level)) = capacity`, for demands that do not
 * fit. Claimants are visited by demand per unit of weight, smallest first: each one under the
 * level takes its demand, and the rest split what is left by weight.
 */
function waterLevel(input: FairShareInput, capacity: number): number {
  const count = input.demands.length;
  const order = Array.from({ length: count }, (_, i) => i);
  const perWeight = (i: number) => clean(input.demands[i]!) / weightOf(input, i);
  order.sort((a, b) => perWeight(a) - perWeight(b));
  let remaining = capacity;
  let weightLeft = 0;
  for (let i = 0; i < count; i++) weightLeft += weightOf(input, i);
  for (const i of order) {
    const weight = weightOf(input, i);
    const level = remaining / weightLeft;
    if (perWeight(i) >= level) return level;
    remaining -= clean(input.demands[i]!);
    weightLeft -= weight;
  }
  // Unreachable for demands that exceed the capacity; a safe answer for float edge cases.
  return weightLeft > 0 ? remaining / weightLeft : 0;
}

function weightOf(input: FairShareInput, index: number): number {
  const weight = input.weights?.[index];
  return weight !== undefined && Number.isFinite(weight) && weight > 0 ? weight : 1;
}

function clean(value: number): number {
  return Number.isFinite(value) && value > 0 ? value : 0;
}
