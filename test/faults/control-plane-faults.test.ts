import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { type FaultProxy, startFaultProxy } from '../helpers/fault-proxy.js';
import { type SpillwayProcess, scrape, stopSpillway, waitFor } from '../integration/spillway-process.js';
import {
  Fleet,
  type HostReading,
  type HostSpec,
  impliedAdmittedRps,
  readHost,
  sleep,
  watchServing as watchHostsServing,
} from './fleet.js';

// Faults between and inside the tiers of a real fleet on loopback: hosts -> [proxy HA] -> aggregator
// -> [proxy AC] -> controller, every one its own process speaking gRPC. The proxies inject network
// partitions; processes are killed and restarted. What must hold throughout: hosts never fail a
// request (allow() never throws: a throw would end the load generator and the process), keep
// admitting, hold and then decay their ratios by the stale policy, and the loop comes back.

const INTERVAL_MS = 500;
const LIMIT_RPS = 300;
const TTL_MS = 4 * INTERVAL_MS; // the limits file's default
const HOLD_MS = 3 * INTERVAL_MS; // the hosts' default stale hold
/**
 * The earliest a host's held ratio can start to decay after the fault: the host's copy may be up
 * to one report interval old, its relayed TTL up to one forward interval short (the aggregator's
 * copy ages too), then the hold. Intervals are jittered by 10%.
 */
const SAFE_HOLD_MS = TTL_MS - 2 * INTERVAL_MS * 1.1 + HOLD_MS - 200;
/**
 * A directive already in flight when the fault starts may still land (a reply on its way to the
 * aggregator, then relayed at the hosts' next report); after this the hosts' ratios only change by
 * their stale policy. Directives differ by a few percent from tick to tick (offered-rate noise).
 */
const IN_FLIGHT_MS = 2 * INTERVAL_MS * 1.1 - 100;

describe('control plane faults across real processes', { timeout: 180_000 }, () => {
  const fleet = new Fleet(INTERVAL_MS, LIMIT_RPS);
  const proxies: FaultProxy[] = [];
  let controller: SpillwayProcess;
  let aggregator: SpillwayProcess;
  let proxyHA: FaultProxy;
  let proxyAC: FaultProxy;
  const specs: HostSpec[] = [];
  const hosts: SpillwayProcess[] = [];
  let steady: number[] = [];

  const readHosts = () => Promise.all(hosts.map((h, i) => readHost(specs[i]!.id, h)));
  const withinLimit = (readings: HostReading[]) =>
    Math.abs(impliedAdmittedRps(specs, readings) - LIMIT_RPS) <= 0.05 * LIMIT_RPS;

  /**
   * Time from now until the implied admission is within 5% of the limit with reports flowing and
   * fresh directives (at most two intervals old) at every host.
   */
  async function recovery(what: string, timeoutMs = 20_000, extra?: (r: HostReading[]) => boolean) {
    const startedMs = performance.now();
    await waitFor(
      what,
      async () => {
        const readings = await readHosts();
        const ok =
          withinLimit(readings) &&
          readings.every((r) => r.consecutiveFailures === 0 && r.directiveAgeMs <= 2 * INTERVAL_MS) &&
          (extra?.(readings) ?? true);
        return ok ? true : undefined;
      },
      { timeoutMs, everyMs: 50 },
    );
    return performance.now() - startedMs;
  }

  /** The fleet's hosts under a fault (`watchServing`), then each one's /healthz. */
  async function watchServing(durationMs: number, holdUntilMs: number) {
    const { series } = await watchHostsServing(hosts, readHosts, {
      durationMs,
      holdUntilMs,
      inFlightMs: IN_FLIGHT_MS,
    });
    for (const p of hosts) {
      const health = await fetch(`http://${p.ops}/healthz`);
      assert.equal(health.status, 200, `${p.name} healthy`);
    }
    return series;
  }

  const epochOf = (p: SpillwayProcess): number => {
    const line = p.output.find((l) => l.includes('"listening"'));
    return Number((JSON.parse(line!) as { epoch: number }).epoch);
  };

  before(async () => {
    controller = await fleet.controller('ctl-1');
    proxyAC = await startFaultProxy(controller.grpc!);
    proxies.push(proxyAC);
    aggregator = await fleet.aggregator('agg-z1', 'z1', [proxyAC.address]);
    proxyHA = await startFaultProxy(aggregator.grpc!);
    proxies.push(proxyHA);
    specs.push(
      { id: 'h1', zone: 'z1', rps: 300, aggregators: [proxyHA.address] },
      { id: 'h2', zone: 'z1', rps: 150, aggregators: [proxyHA.address] },
    );
    // h2 logs at info: its `stopped` line carries its totals (the restart test reads them).
    hosts.push(
      ...(await Promise.all(specs.map((s, i) => fleet.host(s, i === 1 ? ['--log-level', 'info'] : [])))),
    );
  });

  after(async () => {
    await fleet.close();
    await Promise.all(proxies.map((p) => p.close()));
  });

  it('settles within 5% of the limit', async (t) => {
    const ms = await recovery('a settled loop', 30_000);
    await sleep(2 * INTERVAL_MS);
    await recovery('a settled loop, still', 10_000);
    steady = (await readHosts()).map((r) => r.effectiveRatio);
    t.diagnostic(`settled after ${ms.toFixed(0)} ms; ratios ${steady.map((r) => r.toFixed(3)).join(', ')}`);
    assert.ok(steady.every((r) => r > 0.2));
  });

  it('partition hosts <-> aggregator: hosts serve on their held ratio, then recover', async (t) => {
    steady = (await readHosts()).map((r) => r.effectiveRatio);
    proxyHA.setMode('blackhole');
    try {
      await watchServing(3_000, SAFE_HOLD_MS);
      const failing = await readHosts();
      assert.ok(
        failing.every((r) => r.consecutiveFailures > 0),
        'the partition was real: reports failed',
      );
      // Two timeouts in a row replace the connection (counted and logged), so a healed path is not
      // left waiting on the stuck connection's retransmission backoff.
      for (const host of hosts) {
        const series = await scrape(host.ops);
        const reconnects = [...series].filter(([key]) => key.startsWith('spillway_control_reconnects_total'));
        assert.ok(
          reconnects.some(([, value]) => value >= 1),
          `a host replaced its connection: ${JSON.stringify(reconnects)}`,
        );
      }
    } finally {
      proxyHA.setMode('pass');
    }
    const ms = await recovery('recovery after the host-side partition');
    t.diagnostic(
      `healed: back within 5% of the limit in ${ms.toFixed(0)} ms (${(ms / INTERVAL_MS).toFixed(1)} intervals)`,
    );
    assert.ok(ms <= 12 * INTERVAL_MS, `recovered in ${ms.toFixed(0)} ms`);
  });

  it('partition aggregator <-> controller: hosts are still answered and hold, then recover', async (t) => {
    steady = (await readHosts()).map((r) => r.effectiveRatio);
    proxyAC.setMode('blackhole');
    try {
      const series = await watchServing(3_000, SAFE_HOLD_MS);
      // The aggregator answers hosts from its cache and never waits on its parent.
      for (const { readings } of series) {
        for (const r of readings) assert.equal(r.consecutiveFailures, 0, `${r.id}'s reports kept succeeding`);
      }
    } finally {
      proxyAC.setMode('pass');
    }
    const ms = await recovery('recovery after the upstream partition');
    t.diagnostic(
      `healed: back within 5% of the limit in ${ms.toFixed(0)} ms (${(ms / INTERVAL_MS).toFixed(1)} intervals)`,
    );
    assert.ok(ms <= 12 * INTERVAL_MS, `recovered in ${ms.toFixed(0)} ms`);
  });

  it('controller killed: hosts keep serving, hold, then decay toward 0', async (t) => {
    steady = (await readHosts()).map((r) => r.effectiveRatio);
    controller.child.kill('SIGKILL');
    await controller.exited;
    const series = await watchServing(7_000, SAFE_HOLD_MS);
    const last = series.at(-1)!;
    const firstHeld = series.findIndex((s) => s.atMs >= IN_FLIGHT_MS);
    const held = series[firstHeld]!.readings.map((r) => r.effectiveRatio);
    last.readings.forEach((r, i) => {
      assert.equal(r.consecutiveFailures, 0, `${r.id} is still answered by its aggregator`);
      // Stale by ~2 s, held 1.5 s, then 10 s of linear decay: at 7 s at least ~25% down.
      assert.ok(r.effectiveRatio <= 0.85 * held[i]!, `${r.id} decays: ${r.effectiveRatio} vs ${held[i]}`);
    });
    // Decay only goes down (up to local rescale's wobble).
    for (let k = firstHeld + 1; k < series.length; k++) {
      for (const [i, r] of series[k]!.readings.entries()) {
        const before = series[k - 1]!.readings[i]!.effectiveRatio;
        assert.ok(r.effectiveRatio <= before + 0.05 * held[i]!, `${r.id} decays monotonically`);
      }
    }

    const health = await fetch(`http://${aggregator.ops}/healthz`);
    assert.equal(health.status, 200, 'aggregator healthy without its parent');
    t.diagnostic(
      `after 7 s without a controller: ratios ${last.readings.map((r) => r.effectiveRatio.toFixed(3)).join(', ')} (held ${held.map((r) => r.toFixed(3)).join(', ')})`,
    );
  });

  it('controller restarted (new epoch): back within 5% of the limit', async (t) => {
    const startedMs = performance.now();
    controller = await fleet.controller('ctl-2');
    const listeningMs = performance.now() - startedMs;
    proxyAC.setTarget(controller.grpc!);
    const epoch = epochOf(controller);
    const ms = await recovery('the new epoch within 5% of the limit', 20_000, (readings) =>
      readings.every((r) => r.epoch === epoch),
    );
    const aggregatorSeries = await scrape(aggregator.ops);
    const early = (name: string) => aggregatorSeries.get(name) ?? 0;
    t.diagnostic(
      `restarted controller listening after ${listeningMs.toFixed(0)} ms; hosts within 5% of the limit on the new epoch ${ms.toFixed(0)} ms later (${(ms / INTERVAL_MS).toFixed(1)} intervals; target 3); aggregator forwards at reconnect ${early('spillway_aggregator_reconnect_forwards_total')}, cold ${early('spillway_aggregator_cold_forwards_total')}`,
    );
    // Target: 3 intervals; typically 1-2 (the aggregator forwards when its connection is back, the
    // controller answers that forward with a ratio, each host's next report brings it). Regression
    // bound with room for a loaded CI machine's process and timer lag.
    assert.ok(ms <= 6 * INTERVAL_MS, `took ${ms.toFixed(0)} ms`);
  });

  it('every tier restarted in turn under load: no crash, hosts count every call, the loop recovers', async (t) => {
    const figures: string[] = [];

    // Aggregator: killed hard, replaced on a new port behind the same proxy.
    aggregator.child.kill('SIGKILL');
    await aggregator.exited;
    aggregator = await fleet.aggregator('agg-z1b', 'z1', [proxyAC.address]);
    proxyHA.setTarget(aggregator.grpc!);
    figures.push(`aggregator ${(await recovery('recovery after an aggregator restart')).toFixed(0)} ms`);

    // Host: stopped gracefully (final report sent), replaced.
    const code = await stopSpillway(hosts[1]!, 10_000);
    assert.equal(code, 0, 'host exits cleanly');
    const stoppedLine = hosts[1]!.output.find((l) => l.includes('"stopped"'));
    const totals = (
      JSON.parse(stoppedLine!) as { totals: { offered: number; admitted: number; dropped: number }[] }
    ).totals[0]!;
    assert.equal(totals.offered, totals.admitted + totals.dropped, 'every call was admitted or dropped');
    hosts[1] = await fleet.host(specs[1]!, ['--log-level', 'info']);
    figures.push(`host ${(await recovery('recovery after a host restart')).toFixed(0)} ms`);

    // Controller: stopped gracefully, replaced (new epoch).
    assert.equal(await stopSpillway(controller, 10_000), 0, 'controller exits cleanly');
    controller = await fleet.controller('ctl-3');
    proxyAC.setTarget(controller.grpc!);
    const epoch = epochOf(controller);
    figures.push(
      `controller ${(await recovery('recovery after a controller restart', 20_000, (r) => r.every((x) => x.epoch === epoch))).toFixed(0)} ms`,
    );
    t.diagnostic(`back within 5% of the limit after each restart: ${figures.join(', ')}`);
    for (const p of [...hosts, aggregator, controller]) assert.ok(p.running, `${p.name} running`);
  });

  it('SIGTERM stops every process cleanly', async () => {
    const all = [...hosts, aggregator, controller];
    const codes = await Promise.all(all.map((p) => stopSpillway(p, 10_000)));
    assert.deepEqual(
      codes,
      all.map(() => 0),
      all.map((p) => `${p.name}:\n${p.output.slice(-5).join('\n')}`).join('\n'),
    );
  });
});
