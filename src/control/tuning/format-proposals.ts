import { utcDate } from './history-store.js';
import { formatRps, quantileName, type TuningProposal } from './propose-limits.js';

export interface FormatProposalsOptions {
  /**
   * The proposals were just applied (`spillway tune --apply`): the buckets actually written. An
   * opted-in proposal is then `applied` or `not applied` (the day's step was already taken), never
   * `apply (auto)`, which says what applying would do.
   */
  applied?: readonly string[];
}

/**
 * The human form of proposals, as `spillway tune` prints them: a table (one row per rule) followed by
 * each proposal's explanation. docs/tuning.md shows an example.
 */
export function formatProposals(
  proposals: readonly TuningProposal[],
  options: FormatProposalsOptions = {},
): string {
  const header = ['bucket', 'current', 'proposed', 'change', 'action', 'status'];
  const applied = options.applied === undefined ? undefined : new Set(options.applied);
  const action = (p: TuningProposal): string => {
    if (p.action !== 'apply') return p.action;
    if (applied === undefined) return 'apply (auto)';
    return applied.has(p.bucket) ? 'applied' : 'not applied';
  };
  const rows = proposals.map((p) => [
    p.bucket,
    formatRps(p.currentLimitRps),
    p.status === 'change' || p.status === 'unchanged' ? formatRps(p.proposedLimitRps) : '-',
    p.status === 'change' ? formatChange(p.changeRatio) : '-',
    action(p),
    p.status,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === 0 || i >= 4 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)))
      .join('  ')
      .trimEnd();
  const out = [line(header), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line), ''];
  for (const p of proposals) out.push(...explainProposal(p), '');
  return out.join('\n');
}

/** One proposal's explanation: which peaks, which quantile, headroom, clamps, before and after. */
export function explainProposal(p: TuningProposal): string[] {
  const title = `${p.bucket}: ${p.status}${p.auto ? ' (tuning.auto)' : ''}`;
  const e = p.explanation;
  if (!e) return [title, `  ${p.reason}`];
  const lines = [title];
  const days = e.dailyPeaks;
  lines.push(
    `  history: ${days.length} day${days.length === 1 ? '' : 's'} with demand in ${utcDate(e.windowStartMs)}..${utcDate(
      e.windowEndMs - 1,
    )} (UTC), daily peaks of offered rps`,
  );
  if (days.length > 0)
    lines.push(`  peaks: ${days.map((d) => `${d.date.slice(5)} ${formatRps(d.peakOfferedRps)}`).join(', ')}`);
  const s = e.sizing;
  if (!s) {
    lines.push(`  no proposal: ${p.reason}`);
    return lines;
  }
  const q = e.parameters.quantile;
  lines.push(
    `  ${quantileName(q)} of daily peaks: ${ordinal(s.rank)} highest of ${days.length} = ${formatRps(
      s.chosen.peakOfferedRps,
    )} rps on ${s.chosen.date}` +
      (s.ignored.length > 0
        ? `; ignored above it: ${s.ignored.map((d) => `${d.date} ${formatRps(d.peakOfferedRps)}`).join(', ')}`
        : ''),
  );
  lines.push(`  x (1 + headroom ${e.parameters.headroom}) = ${formatRps(s.withHeadroomRps)} rps`);
  for (const c of s.clamps) {
    const bound =
      c.kind === 'maxChangePerDay'
        ? `maxChangePerDay ${e.parameters.maxChangePerDay}: current ${formatRps(p.currentLimitRps)} ${
            c.toRps > p.currentLimitRps ? '+' : '-'
          }${Math.round(e.parameters.maxChangePerDay * 1000) / 10}%`
        : `${c.kind === 'floor' ? 'floorRps' : 'ceilingRps'} ${formatRps(c.boundRps)}`;
    lines.push(`  clamped by ${bound}: ${formatRps(c.fromRps)} -> ${formatRps(c.toRps)}`);
  }
  const verdict =
    p.status === 'change'
      ? `${formatChange(p.changeRatio)}, ${p.action === 'apply' ? 'applied automatically (tuning.auto)' : 'for review'}`
      : 'unchanged (within the minimum change)';
  lines.push(`  limit: ${formatRps(p.currentLimitRps)} -> ${formatRps(p.proposedLimitRps)} rps (${verdict})`);
  return lines;
}

function formatChange(ratio: number): string {
  const percent = Math.round(ratio * 1000) / 10;
  return `${percent >= 0 ? '+' : ''}${percent}%`;
}

function ordinal(n: number): string {
  const tens = n % 100;
  if (tens >= 11 && tens <= 13) return `${n}th`;
  return `${n}${['th', 'st', 'nd', 'rd'][n % 10] ?? 'th'}`;
}
