import type { LimitsConfig, RatioPolicySpec } from '../config/index.js';
import { createAggregator } from '../control/aggregator.js';
import { type Controller, createController } from '../control/controller.js';
import { createRatioPolicy } from '../control/ratio-policy.js';
import type { Random, Scheduler } from '../core/clock.js';
import type { BurstGuardOptions } from '../global/burst-guard.js';
import { createGlobalLimiter, type GlobalLimiter } from '../global/global-limiter.js';
import type { ControlServer } from '../transport/control-transport.js';
import { InMemoryNetwork } from '../transport/in-memory-network.js';
import type { Scenario, ScenarioEvent } from './scenario.js';
import type { AdmissionPoint, SimFleet } from './sim-fleet.js';
import type { VariantName } from './variants.js';

/** Knobs of the Spillway variants; absent fields take the components' own defaults. */
export interface SpillwayFleetTuning {
  /** Ratio policy of the `spillway` and `guard` variants (default: the controller's default). */
  ratioPolicy?: RatioPolicySpec;
  /** Burst guard of the `guard` variant (default: the data plane's defaults). */
  burstGuard?: BurstGuardOptions;
  /** Local rescale of the `spillway` and `guard` variants (default: the data plane's default). */
  localRescale?: boolean;
}

export interface SpillwayFleetOptions {
  variant: Exclude<VariantName, 'exact'>;
  scenario: Scenario;
  scheduler: Scheduler;
  random: Random;
  tuning: SpillwayFleetTuning;
  /** The network the fleet talks over (default: one built from the scenario's network options). */
  network?: InMemoryNetwork;
}

const CONTROLLER_ADDRESS = 'controller';

const aggregatorAddress = (zone: number, index: number) => `agg-z${zone}-${index}`;

/**
 * The real thing, in virtual time: every host is a `createGlobalLimiter`, every zone has
 * `aggregatorsPerZone` `createAggregator`s, one `createController` holds the limits, and they talk
 * protobuf over the `InMemoryNetwork` with the scenario's delay, jitter and loss. Nothing here is
 * a model of those components; the simulator only adds traffic and faults.
 *
 * Hosts list their zone's aggregators in failover order, rotated round-robin as they join the
 * zone, so a zone's hosts spread evenly over its aggregators.
 */
export function createSpillwayFleet(options: SpillwayFleetOptions): SimFleet {
  const { scenario, scheduler, random, variant, tuning } = options;
  const network = options.network ?? new InMemoryNetwork({ scheduler, random, ...scenario.network });
  const ratioPolicySpec: RatioPolicySpec | undefined =
    variant === 'plain' ? { kind: 'plain' } : tuning.ratioPolicy;
  const burstGuard: BurstGuardOptions | false = variant === 'guard' ? (tuning.burstGuard ?? {}) : false;
  // The plain variant is the published formula alone: no host-side correction either.
  const localRescale = variant === 'plain' ? false : tuning.localRescale;

  const limits: LimitsConfig = {
    version: 1,
    intervalMs: scenario.intervalMs,
    ttlMs: 4 * scenario.intervalMs,
    buckets: scenario.buckets.map((b) => ({
      key: b.key,
      limitRps: b.limitRps,
      mode: 'enforce',
      scope: 'global',
    })),
  };

  const startController = (): { controller: Controller; server: ControlServer } => {
    const controller = createController({
      id: CONTROLLER_ADDRESS,
      config: limits,
      scheduler,
      // A restarted controller's epoch is its start time, so it wins over its predecessor.
      epoch: scheduler.nowMs(),
      ...(ratioPolicySpec ? { ratioPolicy: createRatioPolicy(ratioPolicySpec) } : {}),
    });
    const server = network.listen(CONTROLLER_ADDRESS, controller.handleReport);
    controller.start();
    return { controller, server };
  };
  let control = startController();

  const aggregators = Array.from({ length: scenario.zones }, (_, zone) =>
    Array.from({ length: scenario.aggregatorsPerZone }, (_, index) => {
      const address = aggregatorAddress(zone, index);
      const aggregator = createAggregator({
        id: address,
        zone: `zone-${zone}`,
        parents: [network.connect(CONTROLLER_ADDRESS, { from: address })],
        intervalMs: scenario.intervalMs,
        scheduler,
        random,
      });
      network.listen(address, aggregator.handleReport);
      aggregator.start();
      return aggregator;
    }),
  );

  const hosts = new Map<number, GlobalLimiter>();
  /** Each host's links, one per aggregator of its zone: the sender addresses `host-links-down` cuts. */
  const hostLinks = new Map<number, { zone: number; index: number; from: string }[]>();
  /** Aggregators whose host links are cut (`zone:index`): a host joining meanwhile is cut from them too. */
  const cutAggregators = new Set<string>();
  // Hosts joined so far per zone: each new host's first aggregator is the next one round-robin, so a
  // zone's hosts spread over its aggregators whatever ids the caller gives them. (Rotating by the
  // host id alone put every host of a zone on the same first aggregator when ids are spread
  // across zones as id % zones, which is how the simulator assigns them.)
  const joinedPerZone = new Array<number>(scenario.zones).fill(0);

  return {
    addHost(hostId, zone) {
      const reporterId = `host-${hostId}`;
      const count = scenario.aggregatorsPerZone;
      const first = (joinedPerZone[zone] ?? 0) % count;
      joinedPerZone[zone] = (joinedPerZone[zone] ?? 0) + 1;
      // One sender address per link, so that a host's link to one aggregator can be cut alone.
      const links = Array.from({ length: count }, (_, i) => {
        const index = (first + i) % count;
        return { zone, index, from: `${reporterId}>${aggregatorAddress(zone, index)}` };
      });
      hostLinks.set(hostId, links);
      for (const link of links) {
        if (cutAggregators.has(`${zone}:${link.index}`)) network.partition(link.from, true);
      }
      const clients = links.map((link) =>
        network.connect(aggregatorAddress(zone, link.index), { from: link.from }),
      );
      const limiter = createGlobalLimiter({
        reporterId,
        zone: `zone-${zone}`,
        clients,
        intervalMs: scenario.intervalMs,
        scheduler,
        random,
        burstGuard,
        ...(localRescale === undefined ? {} : { localRescale }),
      });
      hosts.set(hostId, limiter);
      limiter.start();
      return scenario.buckets.map((b): AdmissionPoint => limiter.bucket(b.key));
    },
    removeHost(hostId) {
      const limiter = hosts.get(hostId);
      hosts.delete(hostId);
      for (const link of hostLinks.get(hostId) ?? []) network.partition(link.from, false);
      hostLinks.delete(hostId);
      void limiter?.stop();
    },
    applyEvent(event: ScenarioEvent) {
      switch (event.kind) {
        case 'aggregator-down':
        case 'aggregator-up':
          for (let zone = 0; zone < scenario.zones; zone++) {
            if (event.zone !== undefined && event.zone !== zone) continue;
            for (let index = 0; index < scenario.aggregatorsPerZone; index++) {
              if (event.index !== undefined && event.index !== index) continue;
              network.partition(aggregatorAddress(zone, index), event.kind === 'aggregator-down');
            }
          }
          break;
        case 'host-links-down':
        case 'host-links-up': {
          const down = event.kind === 'host-links-down';
          const selected = (zone: number, index: number) =>
            (event.zone === undefined || event.zone === zone) &&
            (event.index === undefined || event.index === index);
          for (let zone = 0; zone < scenario.zones; zone++) {
            for (let index = 0; index < scenario.aggregatorsPerZone; index++) {
              if (!selected(zone, index)) continue;
              if (down) cutAggregators.add(`${zone}:${index}`);
              else cutAggregators.delete(`${zone}:${index}`);
            }
          }
          for (const links of hostLinks.values()) {
            for (const link of links) if (selected(link.zone, link.index)) network.partition(link.from, down);
          }
          break;
        }
        case 'controller-down':
          network.partition(CONTROLLER_ADDRESS, true);
          break;
        case 'controller-restart':
          control.controller.stop();
          void control.server.close();
          // close() frees the address synchronously in the in-memory network.
          control = startController();
          network.partition(CONTROLLER_ADDRESS, false);
          break;
        case 'network':
          network.setLink(event);
          break;
        case 'limit':
          limits.buckets = limits.buckets.map((b) =>
            b.key === event.bucket ? { ...b, limitRps: event.limitRps } : b,
          );
          control.controller.updateConfig({ ...limits });
          break;
        default:
          break;
      }
    },
    stop() {
      for (const limiter of hosts.values()) void limiter.stop();
      hosts.clear();
      for (const zone of aggregators) for (const aggregator of zone) void aggregator.stop();
      control.controller.stop();
      void control.server.close();
    },
  };
}
