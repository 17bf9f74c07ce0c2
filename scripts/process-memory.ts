// What the long-running scripts (soak, control-memory) read of a process's memory, and how they fit
// a trend to it: one definition, so their figures stay comparable.
import { readFileSync } from 'node:fs';

/** Resident and anonymous resident memory of a process, in MB (/proc/<pid>/status). */
export function procStatusMb(pid: number): { rssMb: number; anonMb: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const mb = (field: string) =>
    Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)?.[1] ?? Number.NaN) / 1024;
  return { rssMb: mb('VmRSS'), anonMb: mb('RssAnon') };
}

export const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

/** Least-squares slope of `value` against the samples' time `atS` (seconds), per minute. */
export function slopePerMinute<T extends { atS: number }>(
  samples: readonly T[],
  value: (s: T) => number,
): number {
  const mx = mean(samples.map((s) => s.atS));
  const my = mean(samples.map(value));
  const sxy = samples.reduce((n, s) => n + (s.atS - mx) * (value(s) - my), 0);
  const sxx = samples.reduce((n, s) => n + (s.atS - mx) ** 2, 0);
  return sxx === 0 ? 0 : (60 * sxy) / sxx;
}
