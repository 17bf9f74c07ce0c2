import type { Random } from '../core/clock.js';

/**
 * Traffic draws for the simulator. Every variant of a run replays the same draws (same seed, same
 * order, independent of any limiter decision), so differences between variants are the limiters'
 * alone.
 */

/** A Poisson-distributed count with mean `mean`: inversion below 30, a rounded normal above. */
export function poisson(random: Random, mean: number): number {
  if (mean <= 0) return 0;
  if (mean < 30) {
    const u = random();
    let probability = Math.exp(-mean);
    let cumulative = probability;
    let count = 0;
    while (u > cumulative && count < 1000) {
      count++;
      probability *= mean / count;
      cumulative += probability;
    }
    return count;
  }
  // Box-Muller; 1 - u keeps the log argument in (0, 1].
  const u1 = 1 - random();
  const u2 = random();
  const normal = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
  return Math.max(0, Math.round(mean + Math.sqrt(mean) * normal));
}

/** Zipf weight of the host with stable id `id` (0 = uniform). */
export function zipfWeight(id: number, exponent: number): number {
  return exponent === 0 ? 1 : 1 / (id + 1) ** exponent;
}

/**
 * Weighted choice in O(1) per draw (Vose's alias method): which host an arrival lands on.
 * `pick()` returns an index into the weights it was built from.
 */
export class AliasTable {
  readonly size: number;
  readonly #probability: Float64Array;
  readonly #alias: Uint32Array;
  readonly #uniform: boolean;

  constructor(weights: readonly number[]) {
    const n = weights.length;
    this.size = n;
    this.#probability = new Float64Array(n);
    this.#alias = new Uint32Array(n);
    this.#uniform = n > 0 && weights.every((w) => w === weights[0]);
    if (n === 0 || this.#uniform) return;
    const sum = weights.reduce((a, b) => a + b, 0);
    const scaled = weights.map((w) => (w * n) / sum);
    const small: number[] = [];
    const large: number[] = [];
    scaled.forEach((p, i) => {
      (p < 1 ? small : large).push(i);
    });
    while (small.length > 0 && large.length > 0) {
      const less = small.pop()!;
      const more = large.pop()!;
      this.#probability[less] = scaled[less]!;
      this.#alias[less] = more;
      scaled[more] = scaled[more]! + scaled[less]! - 1;
      (scaled[more]! < 1 ? small : large).push(more);
    }
    for (const i of large) this.#probability[i] = 1;
    for (const i of small) this.#probability[i] = 1;
  }

  pick(random: Random): number {
    const x = random() * this.size;
    const column = Math.floor(x);
    if (this.#uniform) return column;
    return x - column < this.#probability[column]! ? column : this.#alias[column]!;
  }
}
