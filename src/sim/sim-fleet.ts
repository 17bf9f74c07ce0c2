import type { ScenarioEvent } from './scenario.js';

/** One host's decision point for one bucket: the simulator calls it once per arriving request. */
export interface AdmissionPoint {
  allow(): boolean;
}

/**
 * What the simulator drives, one per variant. The simulator owns the traffic and the host
 * membership; a fleet only decides requests and reacts to infrastructure events.
 */
export interface SimFleet {
  /** Start a host; returns its decision points, one per scenario bucket in scenario order. */
  addHost(hostId: number, zone: number): AdmissionPoint[];
  /** Stop a host (its reporter stops; aggregators notice by expiry). */
  removeHost(hostId: number): void;
  /** Apply an infrastructure event (aggregator, controller, network, limit). Host events are the simulator's. */
  applyEvent(event: ScenarioEvent): void;
  /** Stop everything still running. */
  stop(): void;
}
