import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
} from '../integration/spillway-process.js';

/**
 * Shared by the fault tests (and scripts/soak.ts): a small fleet of real `spillway` processes on
 * loopback, and readings of the hosts' own metrics.
 */
export const BUCKET = 'pay';

export interface HostSpec {
  id: string;
  zone: string;
  rps: number;
  /** gRPC targets, in failover order. */
  aggregators: string[];
}

export interface HostReading {
  id: string;
  atMs: number;
  offered: number;
  admitted: number;
  dropRatio: number;
  effectiveRatio: number;
  epoch: number;
  /** Age of the held directive (Infinity before any). */
  directiveAgeMs: number;
  consecutiveFailures: number;
  /** Successful reports per parent target so far. */
  reportsOk: Map<string, number>;
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Fleet {
  readonly dir = mkdtempSync(join(tmpdir(), 'spillway-faults-'));
  readonly started: SpillwayProcess[] = [];
  readonly limitsPath = join(this.dir, 'limits.yaml');

  constructor(
    readonly intervalMs: number,
    readonly limitRps: number,
  ) {
    writeFileSync(
      this.limitsPath,
      [
        'version: 1',
        `intervalMs: ${intervalMs}`,
        'buckets:',
        `  - key: "${BUCKET}"`,
        `    limitRps: ${limitRps}`,
        '    mode: enforce',
        '',
      ].join('\n'),
    );
  }

  async track(promise: Promise<SpillwayProcess>): Promise<SpillwayProcess> {
    const p = await promise;
    this.started.push(p);
    return p;
  }

  controller(id: string, extra: string[] = []): Promise<SpillwayProcess> {
    return this.track(
      startSpillway(id, [
        'controller',
        '--config',
        this.limitsPath,
        '--listen',
        '127.0.0.1:0',
        '--ops',
        '127.0.0.1:0',
        '--id',
        id,
        '--log-level',
        'warn',
        ...extra,
      ]),
    );
  }

  aggregator(id: string, zone: string, parents: string[], extra: string[] = []): Promise<SpillwayProcess> {
    return this.track(
      startSpillway(id, [
        'aggregator',
        '--zone',
        zone,
        ...parents.flatMap((p) => ['--parent', p]),
        '--listen',
        '127.0.0.1:0',
        '--ops',
        '127.0.0.1:0',
        '--interval-ms',
        String(this.intervalMs),
        '--id',
        id,
        '--log-level',
        'warn',
        ...extra,
      ]),
    );
  }

  host(spec: HostSpec, extra: string[] = []): Promise<SpillwayProcess> {
    return this.track(
      startSpillway(spec.id, [
        'host',
        '--aggregator',
        spec.aggregators.join(','),
        '--zone',
        spec.zone,
        '--bucket',
        `${BUCKET}=${spec.rps}`,
        '--ops',
        '127.0.0.1:0',
        '--interval-ms',
        String(this.intervalMs),
        '--id',
        spec.id,
        '--log-level',
        'warn',
        ...extra,
      ]),
    );
  }

  async close(): Promise<void> {
    await Promise.all(this.started.map((p) => stopSpillway(p, 3_000)));
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export async function readHost(id: string, process: SpillwayProcess): Promise<HostReading> {
  const series = await scrape(process.ops);
  const atMs = performance.now();
  const get = (name: string) => series.get(seriesKey(name, { bucket: BUCKET })) ?? 0;
  const reportsOk = new Map<string, number>();
  for (const [key, value] of series) {
    const match = /^spillway_reports_total\{parent="([^"]+)",result="ok"\}$/.exec(key);
    if (match) reportsOk.set(match[1]!, value);
  }
  return {
    id,
    atMs,
    offered: get('spillway_offered_total'),
    admitted: get('spillway_admitted_total'),
    dropRatio: get('spillway_drop_ratio'),
    effectiveRatio: get('spillway_effective_drop_ratio'),
    epoch: series.get('spillway_directive_epoch') ?? 0,
    directiveAgeMs:
      1000 * (series.get(seriesKey('spillway_directive_age_seconds', { bucket: BUCKET })) ?? Infinity),
    consecutiveFailures: series.get('spillway_reporter_consecutive_failures') ?? 0,
    reportsOk,
  };
}

/**
 * The fleet's admission rate implied by what each host applies now: Σ offered rps × (1 − effective
 * ratio). Instant (no counting window to wait for) and free of sampling noise, so "within 5% of
 * the limit" can be timed to a scrape.
 */
export function impliedAdmittedRps(hosts: readonly HostSpec[], readings: readonly HostReading[]): number {
  return readings.reduce((sum, r, i) => sum + hosts[i]!.rps * (1 - r.effectiveRatio), 0);
}
