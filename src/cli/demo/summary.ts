import type { DashboardView } from '../../dashboard/dashboard-view.js';

/**
 * The table `spillway demo` prints every few seconds, from the controller's `/api/snapshot`: per
 * bucket what reached the hosts (offered), what they let through (admitted), the limit, the drop
 * ratio the controller sends, and for shadow buckets what would have been dropped.
 */
export function formatDemoSummary(
  view: DashboardView,
  { elapsedS, phase }: { elapsedS: number; phase: string },
) {
  const header = ['bucket', 'mode', 'offered/s', 'admitted/s', 'limit/s', 'ratio', 'would-drop/s'];
  const rows = view.buckets.map((b) => [
    printable(b.key),
    `${b.mode}${b.overridden ? '*' : ''}`,
    b.offeredRps.toFixed(1),
    b.admittedRps.toFixed(1),
    b.limitRps.toFixed(0),
    b.dropRatio.toFixed(2),
    b.mode === 'shadow' ? b.wouldDropRps.toFixed(1) : '-',
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    cells.map((cell, i) => (i < 2 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join('  ');
  const aggregators = view.children.filter((c) => c.tier === 'aggregator').length;
  const late = view.children.filter((c) => c.freshness === 'late').length;
  const minutes = Math.floor(elapsedS / 60);
  const seconds = Math.floor(elapsedS % 60);
  return [
    `t=${minutes}:${String(seconds).padStart(2, '0')}  phase: ${phase}  controller tick ${view.controller.ticks}`,
    line(header),
    ...(rows.length > 0 ? rows.map(line) : ['(no bucket reported yet)']),
    `${view.hostsTotal} data-plane processes report via ${aggregators} aggregators${late > 0 ? ` (${late} late)` : ''}` +
      (view.buckets.some((b) => b.overridden) ? '   * admin override in force' : ''),
  ].join('\n');
}

/**
 * A bucket key as a terminal may show it: keys come from reports (from clients' headers, through a
 * proxy) and may hold control characters, whose escape sequences would rewrite the terminal.
 */
function printable(key: string): string {
  let out = '';
  for (const char of key) {
    const code = char.charCodeAt(0);
    out += code < 0x20 || (code >= 0x7f && code <= 0x9f) ? `\\x${code.toString(16).padStart(2, '0')}` : char;
  }
  return out;
}
