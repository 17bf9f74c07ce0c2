import type { ReporterCap } from '../control/reporter-cap.js';
import { type FlagSpec, type FlagValues, numberFlag, stringFlag, usageError } from './command-line.js';

/** Flags of the per-reporter offered cap (controller and aggregator); see src/control/reporter-cap.ts. */
export const REPORTER_CAP_FLAGS: Record<string, FlagSpec> = {
  'reporter-cap-median': {
    type: 'string',
    valueName: 'k',
    description: "count a reporter's offered rate per host at most k times the bucket's median host",
    defaultText: 'off',
  },
  'reporter-cap-floor-rps': {
    type: 'string',
    valueName: 'rps',
    description: 'the median bound never clips below this rate per host (needs --reporter-cap-median)',
    defaultText: '0',
  },
  'max-offered-rps-per-reporter': {
    type: 'string',
    valueName: 'rps',
    description: 'hard bound on the offered rate one host may claim per bucket',
    defaultText: 'off',
  },
};

export function reporterCapFromFlags(values: FlagValues): ReporterCap | undefined {
  const median = stringFlag(values, 'reporter-cap-median');
  const max = stringFlag(values, 'max-offered-rps-per-reporter');
  // The floor only bounds the median bound: alone it would be ignored in silence.
  if (median === undefined && stringFlag(values, 'reporter-cap-floor-rps') !== undefined) {
    throw usageError(
      '--reporter-cap-floor-rps needs --reporter-cap-median (it is the floor of the median bound)',
      { flag: 'reporter-cap-floor-rps' },
    );
  }
  if (median === undefined && max === undefined) return undefined;
  const cap: ReporterCap = {};
  if (median !== undefined) cap.medianMultiple = numberFlag(values, 'reporter-cap-median', 0, { min: 1 });
  if (stringFlag(values, 'reporter-cap-floor-rps') !== undefined)
    cap.floorRps = numberFlag(values, 'reporter-cap-floor-rps', 0);
  if (max !== undefined) cap.maxRps = numberFlag(values, 'max-offered-rps-per-reporter', 0);
  return cap;
}
