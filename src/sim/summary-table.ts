import type { Convergence } from './metrics.js';
import type { SimResult, VariantSummary } from './run-simulation.js';
import { variantLabels } from './variants.js';

/**
 * The summary of a run as a table, plain text for the terminal or Markdown for docs. Columns are
 * the focus bucket's figures except `excess` and `wrongly dropped`, which add up every bucket.
 */
export const summaryColumns = [
  'variant',
  'steady err %',
  'steady mean abs err %',
  'within 5% after (s)',
  'peak overshoot %',
  'excess admitted',
  'wrongly dropped',
] as const;

export function summaryRows(result: SimResult): string[][] {
  return result.summary.map((summary) => summaryRow(summary));
}

export function summaryRow(summary: VariantSummary): string[] {
  const focus = summary.focus;
  return [
    variantLabels[summary.variant],
    formatSigned(focus.steadyErrorPct),
    focus.steadyAbsErrorPct === null ? '-' : focus.steadyAbsErrorPct.toFixed(2),
    formatConvergence(focus.convergence),
    focus.peakOvershootPct.toFixed(1),
    summary.excessAdmitted.toLocaleString('en-US'),
    summary.wronglyDropped.toLocaleString('en-US'),
  ];
}

/** `20s: 2.3, 40s: 1.0`: time to get back within 5% after each change; the start counts only when nothing else changes. */
export function formatConvergence(convergence: readonly Convergence[]): string {
  const changes = convergence.length > 1 ? convergence.filter((c) => c.atS > 0) : convergence;
  if (changes.length === 0) return '-';
  return changes
    .map((c) => `${c.atS}s: ${c.convergedAfterS === null ? 'never' : c.convergedAfterS.toFixed(1)}`)
    .join(', ');
}

function formatSigned(value: number | null): string {
  if (value === null) return '-';
  return `${value > 0 ? '+' : ''}${value.toFixed(2)}`;
}

export function formatSummaryTable(result: SimResult, format: 'text' | 'markdown' = 'text'): string {
  const header = [...summaryColumns] as string[];
  const rows = summaryRows(result);
  if (format === 'markdown') {
    const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
    return [line(header), line(header.map((_, i) => (i === 0 ? '---' : '---:'))), ...rows.map(line)].join(
      '\n',
    );
  }
  const withCost = [
    [...header, 'wall ms'],
    ...rows.map((row, i) => [...row, String(result.cost[result.summary[i]!.variant]?.wallMs ?? '-')]),
  ];
  const widths = withCost[0]!.map((_, c) => Math.max(...withCost.map((row) => row[c]!.length)));
  const render = (row: string[]) =>
    row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  ');
  return [
    render(withCost[0]!),
    widths.map((w) => '-'.repeat(w)).join('  '),
    ...withCost.slice(1).map(render),
    COLUMNS_NOTE,
  ].join('\n');
}

/** Under the terminal table: where each column's definition is. */
export const COLUMNS_NOTE =
  'What each column measures: docs/accuracy.md, "How it is measured" (figures for the focus bucket; excess and wrongly dropped add up every bucket).';
