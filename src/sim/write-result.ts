import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { SimResult } from './run-simulation.js';
import { renderSimChart } from './svg-chart.js';

export interface WrittenFiles {
  json: string;
  svg: string;
}

/**
 * Write `<name>.json` (the whole result: scenario, options, series, figures) and `<name>.svg` (the
 * focus bucket's chart) into `dir`. `command` is recorded in the JSON so a reader can rerun it.
 */
export function writeSimResult(result: SimResult, dir: string, name: string, command?: string): WrittenFiles {
  mkdirSync(dir, { recursive: true });
  const json = join(dir, `${name}.json`);
  const svg = join(dir, `${name}.svg`);
  writeFileSync(json, `${JSON.stringify(command === undefined ? result : { command, ...result })}\n`);
  writeFileSync(svg, renderSimChart(result));
  return { json, svg };
}
