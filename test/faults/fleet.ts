import assert from 'node:assert/strict';
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
  /** Units the burst guard dropped (spillway_dropped_total counts these and the ratio's). */
  guardDropped: number;
  dropRatio: number;
  effectiveRatio: number;
  epoch: number;
  /** Age of the held directive (Infinity before any). */
  directiveAgeMs: number;
  consecutiveFailures: number;
  /** Successful reports per parent target so far. */
  reportsOk: Map<string, number>;
  /** Reports sent so far, to any parent, by result (ok, timeout, unavailable, error). */
  reportsByResult: Map<string, number>;
  /** The process's longest event-loop delay since its previous scrape (prom-client resets it). */
  eventLoopLagMaxMs: number;
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
  const reportsByResult = new Map<string, number>();
  for (const [key, value] of series) {
    const match = /^spillway_reports_total\{parent="([^"]+)",result="([^"]+)"\}$/.exec(key);
    if (!match) continue;
    if (match[2] === 'ok') reportsOk.set(match[1]!, value);
    reportsByResult.set(match[2]!, (reportsByResult.get(match[2]!) ?? 0) + value);
  }
  return {
    id,
    atMs,
    offered: get('spillway_offered_total'),
    admitted: get('spillway_admitted_total'),
    guardDropped: get('spillway_burst_guard_dropped_total'),
    dropRatio: get('spillway_drop_ratio'),
    effectiveRatio: get('spillway_effective_drop_ratio'),
    epoch: series.get('spillway_directive_epoch') ?? 0,
    directiveAgeMs:
      1000 * (series.get(seriesKey('spillway_directive_age_seconds', { bucket: BUCKET })) ?? Infinity),
    consecutiveFailures: series.get('spillway_reporter_consecutive_failures') ?? 0,
    reportsOk,
    reportsByResult,
    eventLoopLagMaxMs: 1000 * (series.get('spillway_nodejs_eventloop_lag_max_seconds') ?? 0),
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

export interface ServingReadings {
  atMs: number;
  readings: HostReading[];
}

/**
 * Polls the hosts every 250 ms for `durationMs` while a fault is in force, asserting on every
 * reading that each host runs and decides (offered and admitted grow); that after `inFlightMs`
 * (reports already on their way) no directive arrives through the fault; and until `holdUntilMs`
 * that each applies the ratio it held. The band of 20% is local rescale's: a host may rescale its
 * ratio by its own rate change (on a loaded CI machine the load generator's rate wobbles); the
 * decay, 10% of the ratio per second, and a fail-open (0) both fall out of it.
 */
export async function watchServing(
  hosts: readonly SpillwayProcess[],
  readHosts: () => Promise<HostReading[]>,
  { durationMs, holdUntilMs, inFlightMs }: { durationMs: number; holdUntilMs: number; inFlightMs: number },
): Promise<{ series: ServingReadings[]; held: HostReading[] }> {
  const startedMs = performance.now();
  let previous = await readHosts();
  let held: HostReading[] | undefined;
  const series: ServingReadings[] = [];
  while (performance.now() - startedMs < durationMs) {
    await sleep(250);
    const readings = await readHosts();
    const atMs = performance.now() - startedMs;
    readings.forEach((r, i) => {
      assert.ok(hosts[i]!.running, `${r.id} is running`);
      assert.ok(r.admitted > previous[i]!.admitted, `${r.id} keeps admitting (${atMs.toFixed(0)} ms in)`);
      assert.ok(r.offered > previous[i]!.offered, `${r.id} keeps deciding`);
      if (held) assert.equal(r.dropRatio, held[i]!.dropRatio, `${r.id} got no directive through the fault`);
      if (held && atMs < holdUntilMs) {
        assert.ok(
          Math.abs(r.effectiveRatio - held[i]!.effectiveRatio) <= 0.2 * held[i]!.effectiveRatio,
          `${r.id} holds its ratio ${held[i]!.effectiveRatio} at ${atMs.toFixed(0)} ms, applies ${r.effectiveRatio}`,
        );
      }
      assert.ok(
        r.effectiveRatio > 0 || atMs > holdUntilMs,
        `${r.id} still applies a ratio at ${atMs.toFixed(0)} ms (its directive's ${r.dropRatio}, epoch ${r.epoch}, ` +
          `${r.directiveAgeMs.toFixed(0)} ms old)`,
      );
    });
    if (!held && atMs >= inFlightMs) held = readings;
    series.push({ atMs, readings });
    previous = readings;
  }
  return { series, held: held ?? [] };
}
