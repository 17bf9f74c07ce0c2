/**
 * What a run compares, side by side on the same traffic:
 *
 * - `exact`: one perfect shared store (a global token bucket deciding every request with no lag).
 * - `plain`: the published formula alone: ratio = max(0, (offered - limit) / offered) from the
 *   last interval only, no smoothing, no burst guard.
 * - `spillway`: Spillway as configured by default (ratio policy, recompute on report, local
 *   rescale), no burst guard.
 * - `guard`: `spillway` plus the host-local burst guard.
 */
export const variantNames = ['exact', 'plain', 'spillway', 'guard'] as const;

export type VariantName = (typeof variantNames)[number];

export const variantLabels: Record<VariantName, string> = {
  exact: 'exact centralized',
  plain: 'plain formula',
  spillway: 'spillway (defaults)',
  guard: 'spillway + burst guard',
};

export function isVariantName(value: string): value is VariantName {
  return (variantNames as readonly string[]).includes(value);
}
