import type { RatioPolicySpec } from '../config/limits-config.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { computeDropRatio } from './drop-ratio.js';

/** What the controller knows about one bucket (or one zone of a zone-scoped bucket) at a tick. */
export interface RatioInput {
  /** Sum of fresh children's offered rates. */
  offeredRps: number;
  /**
   * Sum of fresh children's admitted rates minus would-drops: what enforcement let (or would have
   * let) through in the same windows. The `corrected` policy steers this to the limit.
   */
  admittedRps: number;
  limitRps: number;
}

/**
 * Turns offered load into a drop ratio, one bucket at a time, once per tick. A policy is a pure
 * unit: no clock, no RNG, no I/O; its only memory is the per-bucket state it creates, which the
 * controller keeps across ticks and config reloads. The fleet simulator compares policies by
 * injecting them.
 */
export interface RatioPolicy<S = unknown> {
  readonly spec: RatioPolicySpec;
  /**
   * The ratio depends on this input alone (no memory): the controller may recompute it whenever
   * fresher sums arrive, i.e. on every report, not only at ticks.
   */
  readonly stateless?: boolean;
  createState(): S;
  /** The ratio for this tick, in [0, 1]. May update `state` in place; must not keep `input` (it is reused). */
  nextDropRatio(state: S, input: RatioInput): number;
}

/**
 * The default, chosen by measurement in the fleet simulator (docs/accuracy.md, "Conclusions"): the
 * plain ratio. In a host -> aggregator -> controller tree the `corrected` integral sees the admitted
 * rate about three intervals after the ratio that produced it, winds up, and overcorrects after
 * every change; its gain in the small closed loop of docs/control-plane.md (hosts that ignore
 * directives, ramps) does not carry over. Plain is also stateless, so the controller recomputes it
 * on every report (ratio-groups.ts, `recomputeOnReport`).
 */
export const DEFAULT_RATIO_POLICY: RatioPolicySpec = { kind: 'plain' };

export function createRatioPolicy(spec: RatioPolicySpec = DEFAULT_RATIO_POLICY): RatioPolicy {
  switch (spec.kind) {
    case 'plain':
      return plainRatioPolicy();
    case 'ewma':
      return ewmaRatioPolicy(spec.alpha);
    case 'corrected':
      return correctedRatioPolicy(spec);
    default:
      throw new SpillwayError(ErrorCode.InvalidOption, `unknown ratio policy ${JSON.stringify(spec)}`, {
        field: 'ratioPolicy',
      });
  }
}

/** Assumes the next window equals the last: exact for constant load, overshoots during ramps. */
export function plainRatioPolicy(): RatioPolicy<null> {
  return {
    spec: { kind: 'plain' },
    stateless: true,
    createState: () => null,
    nextDropRatio: (_state, input) => computeDropRatio(input.offeredRps, input.limitRps),
  };
}

export interface EwmaState {
  offeredRps: number;
  primed: boolean;
}

/**
 * Smooths offered with an exponentially weighted moving average (weight `alpha` on the newest
 * window) before the plain ratio: less noise in the ratio, more lag in ramps.
 */
export function ewmaRatioPolicy(alpha: number): RatioPolicy<EwmaState> {
  assertUnit('alpha', alpha);
  return {
    spec: { kind: 'ewma', alpha },
    createState: () => ({ offeredRps: 0, primed: false }),
    nextDropRatio(state, input) {
      const offered = Math.max(0, input.offeredRps);
      state.offeredRps = state.primed ? alpha * offered + (1 - alpha) * state.offeredRps : offered;
      state.primed = true;
      return computeDropRatio(state.offeredRps, input.limitRps);
    },
  };
}

/** Per-bucket memory of the corrected policy (exported for tests and the simulator's inspection). */
export interface CorrectedState {
  /** Relative adjustment of the limit the plain ratio aims at, in [-maxCorrection, maxCorrection]. */
  correction: number;
  /** Consecutive ticks the bucket has been over its limit. */
  overloadedTicks: number;
  /** Smoothed offered rate (equal to the last window's with offeredAlpha 1). */
  offeredRps: number;
  primed: boolean;
}

/**
 * Ticks a bucket must stay over its limit before the correction integrates: the admitted rate in
 * the first windows of an overload was measured before any ratio reached the hosts (the loop's
 * lag is about two intervals), and integrating it would wind the correction up.
 */
const SETTLE_TICKS = 2;

export interface CorrectedRatioOptions {
  /** Share of the relative admitted-vs-limit error added to the correction per tick. */
  gain: number;
  /** Bound on the correction, as a fraction of the limit (anti-windup and blast-radius bound). */
  maxCorrection: number;
  /** EWMA weight of the newest window's offered rate; 1 (default) uses the last window as is. */
  offeredAlpha?: number;
}

/**
 * The plain ratio aimed at `limit * (1 + correction)`, where `correction` integrates the relative
 * error `(limit - admitted) / limit` with `gain` per tick while the bucket is over its limit
 * (conditional integration is the anti-windup), and decays by `gain` per tick while it is not.
 * With a loop delay of two ticks the integral is stable for gain < 0.6; 0.2 settles in under 10.
 */
export function correctedRatioPolicy(options: CorrectedRatioOptions): RatioPolicy<CorrectedState> {
  const { gain, maxCorrection } = options;
  const alpha = options.offeredAlpha ?? 1;
  assertUnit('gain', gain);
  assertUnit('maxCorrection', maxCorrection);
  assertUnit('offeredAlpha', alpha);
  const spec: RatioPolicySpec = { kind: 'corrected', gain, maxCorrection };
  if (alpha !== 1) spec.offeredAlpha = alpha;
  return {
    spec,
    createState: () => ({ correction: 0, overloadedTicks: 0, offeredRps: 0, primed: false }),
    nextDropRatio(state, input) {
      const { limitRps } = input;
      const offered = Math.max(0, input.offeredRps);
      state.offeredRps = state.primed ? alpha * offered + (1 - alpha) * state.offeredRps : offered;
      state.primed = true;
      if (offered > limitRps && limitRps > 0) {
        state.overloadedTicks++;
        const error = (limitRps - Math.max(0, input.admittedRps)) / limitRps;
        if (state.overloadedTicks > SETTLE_TICKS && Number.isFinite(error)) {
          state.correction = Math.min(
            maxCorrection,
            Math.max(-maxCorrection, state.correction + gain * error),
          );
        }
      } else {
        state.overloadedTicks = 0;
        state.correction *= 1 - gain;
      }
      return computeDropRatio(state.offeredRps, limitRps * (1 + state.correction));
    },
  };
}

function assertUnit(name: string, value: number): void {
  if (!(value > 0 && value <= 1)) {
    throw new SpillwayError(ErrorCode.InvalidOption, `${name} must be in (0, 1], got ${value}`, {
      field: name,
    });
  }
}
