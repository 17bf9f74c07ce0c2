import type { SimResult } from './run-simulation.js';
import { type VariantName, variantLabels } from './variants.js';

/**
 * A self-contained SVG of one bucket of a run: offered, limit and each variant's admitted rate
 * over time (top), and the drop ratio each variant applied against the ideal one (bottom).
 * Hand-written so the simulator needs no plotting dependency; a browser or any Markdown viewer
 * shows it.
 */
const MARGIN = { left: 72, top: 36, bottom: 36 };
const PLOT_WIDTH = 688;
const RATE_PANEL = { top: MARGIN.top, height: 300 };
const RATIO_PANEL = { top: MARGIN.top + 300 + 48, height: 150 };
const HEIGHT = RATIO_PANEL.top + RATIO_PANEL.height + MARGIN.bottom;
/** Each panel's legend, right of the plot: a line sample, then its label. */
const LEGEND = { gap: 14, sample: 22, labelGap: 6, rowHeight: 20, fontSize: 11, right: 12 };
/**
 * A generous width per character of the legend's font (system-ui at 11 px averages about 6 px; 7
 * leaves room for wide glyphs), so the image is always wide enough for its longest label.
 */
export const LEGEND_CHAR_WIDTH = 7;

export const variantColors: Record<VariantName, string> = {
  exact: '#2b8a3e',
  plain: '#e8590c',
  spillway: '#1c7ed6',
  guard: '#ae3ec9',
};

export function renderSimChart(result: SimResult, bucketKey = result.scenario.focusBucket): string {
  const series = result.series.find((s) => s.key === bucketKey);
  if (!series) throw new Error(`no series for bucket ${bucketKey}`);
  const samples = series.offered.length;
  const sampleS = result.sampleMs / 1000;
  const totalS = samples * sampleS;
  const toRps = (count: number) => count / sampleS;
  // Rates are shown as a sliding mean over 1 s, the window every figure is measured on.
  const smooth = (values: readonly number[]) => slidingMean(values, Math.round(1 / sampleS)).map(toRps);
  const offeredRps = smooth(series.offered);
  const admittedRps = result.variants.map((v) => ({ variant: v, rps: smooth(series.admitted[v]!) }));
  // Loops, not Math.max(...values): a day-long run has 864,000 samples, past the engine's argument limit.
  const maxLimit = maxOf(series.limitRps);
  const maxAdmitted = admittedRps.reduce((max, a) => Math.max(max, maxOf(a.rps)), -Infinity);
  const maxOffered = maxOf(offeredRps);
  // Offered can be 15x the limit; scale to what the limiters admit so their errors stay visible.
  const yMax = niceCeil(Math.max(maxLimit * 1.6, maxAdmitted * 1.1, Math.min(maxOffered, maxLimit * 3)) || 1);
  const offeredClipped = maxOffered > yMax;

  // Each panel's legend: the rates above, the drop ratios below (where their lines are).
  type LegendItem = { label: string; color: string; dash?: string; width?: number };
  const rateLegend: LegendItem[] = [
    {
      label: offeredClipped ? `offered (peak ${formatRps(maxOffered)}, clipped)` : 'offered',
      color: '#adb5bd',
      width: 2,
    },
    { label: 'limit', color: '#c92a2a', dash: '6 4' },
    ...result.variants.map((v) => ({ label: `admitted: ${variantLabels[v]}`, color: variantColors[v] })),
  ];
  const ratioLegend: LegendItem[] = [
    { label: 'ideal (offered over the limit)', color: '#212529', dash: '4 3' },
    ...result.variants
      .filter((v) => v !== 'exact')
      .map((v) => ({ label: `applied: ${variantLabels[v]}`, color: variantColors[v] })),
  ];
  const legendX = MARGIN.left + PLOT_WIDTH + LEGEND.gap;
  const labelX = legendX + LEGEND.sample + LEGEND.labelGap;
  const longestLabel = Math.max(...[...rateLegend, ...ratioLegend].map((item) => item.label.length));
  const WIDTH = Math.ceil(labelX + longestLabel * LEGEND_CHAR_WIDTH + LEGEND.right);
  const x = (tS: number) => MARGIN.left + (tS / totalS) * PLOT_WIDTH;
  const yRate = (rps: number) => RATE_PANEL.top + RATE_PANEL.height * (1 - rps / yMax);
  const yRatio = (ratio: number) => RATIO_PANEL.top + RATIO_PANEL.height * (1 - ratio);
  const timeOf = (i: number) => (i + 1) * sampleS;

  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${HEIGHT}" viewBox="0 0 ${WIDTH} ${HEIGHT}" font-family="system-ui, sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${HEIGHT}" fill="#fff"/>`,
    `<defs><clipPath id="rate-clip"><rect x="${MARGIN.left}" y="${RATE_PANEL.top}" width="${PLOT_WIDTH}" height="${RATE_PANEL.height}"/></clipPath></defs>`,
    `<text x="${MARGIN.left}" y="20" font-size="14" font-weight="600">${escapeXml(
      `${result.scenario.name}: ${bucketKey} (${result.scenario.hosts} hosts, ${result.scenario.zones} zones, seed ${result.seed})`,
    )}</text>`,
  );

  // Axes and grid.
  for (const panel of [
    { top: RATE_PANEL.top, height: RATE_PANEL.height },
    { top: RATIO_PANEL.top, height: RATIO_PANEL.height },
  ]) {
    parts.push(
      `<rect x="${MARGIN.left}" y="${panel.top}" width="${PLOT_WIDTH}" height="${panel.height}" fill="none" stroke="#adb5bd"/>`,
    );
  }
  const timeStepS = niceStep(totalS / 10);
  for (let t = 0; t <= totalS + 1e-9; t += timeStepS) {
    const px = fmt(x(t));
    parts.push(
      `<line x1="${px}" y1="${RATE_PANEL.top}" x2="${px}" y2="${RATIO_PANEL.top + RATIO_PANEL.height}" stroke="#f1f3f5"/>`,
      `<text x="${px}" y="${RATIO_PANEL.top + RATIO_PANEL.height + 16}" text-anchor="middle">${round(t)} s</text>`,
    );
  }
  const rateStep = niceStep(yMax / 5);
  for (let r = 0; r <= yMax + 1e-9; r += rateStep) {
    const py = fmt(yRate(r));
    parts.push(
      `<line x1="${MARGIN.left}" y1="${py}" x2="${MARGIN.left + PLOT_WIDTH}" y2="${py}" stroke="#f1f3f5"/>`,
      `<text x="${MARGIN.left - 6}" y="${py}" text-anchor="end" dominant-baseline="middle">${formatRps(r)}</text>`,
    );
  }
  for (const ratio of [0, 0.25, 0.5, 0.75, 1]) {
    const py = fmt(yRatio(ratio));
    parts.push(
      `<line x1="${MARGIN.left}" y1="${py}" x2="${MARGIN.left + PLOT_WIDTH}" y2="${py}" stroke="#f1f3f5"/>`,
      `<text x="${MARGIN.left - 6}" y="${py}" text-anchor="end" dominant-baseline="middle">${ratio}</text>`,
    );
  }
  parts.push(
    `<text x="14" y="${RATE_PANEL.top + RATE_PANEL.height / 2}" transform="rotate(-90 14 ${RATE_PANEL.top + RATE_PANEL.height / 2})" text-anchor="middle">requests/s (1 s mean)</text>`,
    `<text x="14" y="${RATIO_PANEL.top + RATIO_PANEL.height / 2}" transform="rotate(-90 14 ${RATIO_PANEL.top + RATIO_PANEL.height / 2})" text-anchor="middle">drop ratio</text>`,
  );

  // Change markers (steps, events).
  for (const changeS of result.changeTimesS) {
    if (changeS === 0) continue;
    const px = fmt(x(changeS));
    parts.push(
      `<line x1="${px}" y1="${RATE_PANEL.top}" x2="${px}" y2="${RATIO_PANEL.top + RATIO_PANEL.height}" stroke="#868e96" stroke-dasharray="2 3"/>`,
    );
  }
  for (const event of result.scenario.events) {
    parts.push(
      `<text x="${fmt(x(event.atS) + 3)}" y="${RATE_PANEL.top + 12}" fill="#868e96" font-size="10">${escapeXml(event.kind)}</text>`,
    );
  }

  // The first full 1 s window ends at sample `firstFull`; earlier means would average less than 1 s.
  const firstFull = Math.round(1 / sampleS) - 1;
  const ratePolyline = (values: readonly number[], from: number, color: string, extra = '') =>
    `<polyline clip-path="url(#rate-clip)" fill="none" stroke="${color}" ${extra} points="${values
      .slice(from)
      .map((v, i) => `${fmt(x(timeOf(i + from)))},${fmt(yRate(v))}`)
      .join(' ')}"/>`;
  parts.push(ratePolyline(offeredRps, firstFull, '#adb5bd', 'stroke-width="2"'));
  parts.push(ratePolyline(series.limitRps, 0, '#c92a2a', 'stroke-width="1.5" stroke-dasharray="6 4"'));
  for (const { variant, rps } of admittedRps) {
    parts.push(ratePolyline(rps, firstFull, variantColors[variant], 'stroke-width="1.5"'));
  }

  // Drop ratio panel, per sample (what the hosts applied in that 100 ms).
  const ideal = series.offered.map((offered, i) => {
    const limitCount = series.limitRps[i]! * sampleS;
    return offered > 0 ? Math.max(0, 1 - limitCount / offered) : 0;
  });
  const ratioLine = (values: readonly number[], color: string, extra = '') =>
    `<polyline fill="none" stroke="${color}" stroke-width="1.2" ${extra} points="${values
      .map((v, i) => `${fmt(x(timeOf(i)))},${fmt(yRatio(v))}`)
      .join(' ')}"/>`;
  parts.push(ratioLine(ideal, '#212529', 'stroke-dasharray="4 3"'));
  for (const variant of result.variants) {
    if (variant === 'exact') continue;
    const admitted = series.admitted[variant]!;
    parts.push(
      ratioLine(
        series.offered.map((offered, i) => (offered > 0 ? 1 - admitted[i]! / offered : 0)),
        variantColors[variant],
      ),
    );
  }

  // Legends, one per panel.
  const drawLegend = (items: readonly LegendItem[], top: number) =>
    items.forEach((item, i) => {
      const y = top + 10 + i * LEGEND.rowHeight;
      parts.push(
        `<line x1="${legendX}" y1="${y}" x2="${legendX + LEGEND.sample}" y2="${y}" stroke="${item.color}" stroke-width="${item.width ?? 2}"${
          item.dash ? ` stroke-dasharray="${item.dash}"` : ''
        }/>`,
        `<text class="legend" x="${labelX}" y="${y}" dominant-baseline="middle" font-size="${LEGEND.fontSize}">${escapeXml(item.label)}</text>`,
      );
    });
  drawLegend(rateLegend, RATE_PANEL.top);
  drawLegend(ratioLegend, RATIO_PANEL.top);
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}

function slidingMean(values: readonly number[], window: number): number[] {
  const out: number[] = [];
  let sum = 0;
  for (let i = 0; i < values.length; i++) {
    sum += values[i]!;
    if (i >= window) sum -= values[i - window]!;
    out.push(sum / Math.min(window, i + 1));
  }
  return out;
}

function niceStep(raw: number): number {
  if (!(raw > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const fraction = raw / magnitude;
  return (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10) * magnitude;
}

function niceCeil(value: number): number {
  const step = niceStep(value / 5);
  return Math.ceil(value / step) * step;
}

function formatRps(rps: number): string {
  if (rps >= 1_000_000) return `${round(rps / 1_000_000)}M`;
  if (rps >= 1000) return `${round(rps / 1000)}k`;
  return `${round(rps)}`;
}

function round(value: number): number {
  return Math.round(value * 100) / 100;
}

function fmt(value: number): string {
  return value.toFixed(1);
}

function escapeXml(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

function maxOf(values: readonly number[]): number {
  let max = -Infinity;
  for (const value of values) if (value > max) max = value;
  return max;
}
