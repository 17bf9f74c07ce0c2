import { createController } from '../../src/control/controller.js';
import { ManualClock, seededRandom } from '../../src/core/clock.js';
import { compileRateLimits } from '../../src/envoy/descriptor-rules.js';
import { limitsFromRateLimits } from '../../src/envoy/envoy-limits.js';
import {
  createQuotaService,
  type QuotaService,
  type QuotaServiceOptions,
} from '../../src/envoy/quota-service.js';
import type { StreamRefusal } from '../../src/envoy/quota-stream.js';
import { parseRateLimitConfig } from '../../src/envoy/ratelimit-config.js';
import type { RateLimitQuotaResponse } from '../../src/gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import { createGlobalLimiter, type GlobalLimiter } from '../../src/global/global-limiter.js';
import { InMemoryNetwork } from '../../src/transport/in-memory-network.js';
import { settle } from '../global/fixtures.js';
import { SimEnvoy, type SimEnvoyOptions } from './sim-envoy.js';

/**
 * The RLQS loop in virtual time: a real controller reading the envoyproxy/ratelimit file, one
 * `spillway rls` data plane (a global limiter with the quota service recording its streams' usage)
 * reporting to it over the in-memory network, and simulated Envoys on streams of the service.
 */
export interface QuotaLoop {
  clock: ManualClock;
  service: QuotaService;
  limiter: GlobalLimiter;
  envoys: SimEnvoy[];
  /** Ends reported per stream, in order of the envoys. */
  ended: (StreamRefusal | 'ok' | undefined)[];
  /** Add an Envoy on a stream of its own. */
  addEnvoy(options: Omit<SimEnvoyOptions, 'send'>): SimEnvoy;
  /** Close an Envoy's stream (it vanished). */
  drop(envoy: SimEnvoy): void;
  /** Run virtual time, in steps of `stepMs`. */
  run(ms: number, stepMs?: number): Promise<void>;
  stop(): Promise<void>;
}

export function quotaLoop(config: string, options: Partial<QuotaServiceOptions> = {}, seed = 7): QuotaLoop {
  const clock = new ManualClock(1_700_000_000_000);
  const network = new InMemoryNetwork({ scheduler: clock });
  const limits = compileRateLimits([parseRateLimitConfig(config, 'loop.yaml')]);
  const controller = createController({
    id: 'controller',
    config: limitsFromRateLimits(limits),
    scheduler: clock,
    epoch: 1,
  });
  network.listen('controller', controller.handleReport);
  controller.start();
  let service: QuotaService | undefined;
  const limiter = createGlobalLimiter({
    reporterId: 'rls-1',
    zone: 'z1',
    clients: [network.connect('controller', { from: 'rls-1' })],
    scheduler: clock,
    random: seededRandom(seed),
    onWindowClose: (nowMs) => service?.onWindowClose(nowMs),
    hostCount: () => 1 + (service?.streamCount ?? 0),
  });
  service = createQuotaService({ limiter, limits: () => limits, scheduler: clock, ...options });
  limiter.start();
  service.start();
  const envoys: SimEnvoy[] = [];
  const sessions: ReturnType<QuotaService['open']>[] = [];
  const ended: (StreamRefusal | 'ok' | undefined)[] = [];
  const random = seededRandom(seed + 1);
  return {
    clock,
    service,
    limiter,
    envoys,
    ended,
    addEnvoy(envoyOptions) {
      const index = envoys.length;
      ended.push(undefined);
      let envoy: SimEnvoy | undefined;
      const session = service!.open(
        (response: RateLimitQuotaResponse) => envoy?.onResponse(response),
        (refusal) => {
          ended[index] = refusal ?? 'ok';
        },
      );
      envoy = new SimEnvoy(
        {
          random,
          ...envoyOptions,
          send: (report) => {
            if (ended[index] === undefined) session.receive(report);
          },
        },
        clock.nowMs(),
      );
      envoys.push(envoy);
      sessions.push(session);
      return envoy;
    },
    drop(envoy) {
      const index = envoys.indexOf(envoy);
      sessions[index]?.close();
      envoy.rps = 0;
      ended[index] = 'ok';
    },
    async run(ms, stepMs = 10) {
      for (let elapsed = 0; elapsed < ms; elapsed += stepMs) {
        clock.advance(stepMs);
        const nowMs = clock.nowMs();
        envoys.forEach((envoy, i) => {
          if (ended[i] === undefined) envoy.advance(nowMs);
        });
        await settle();
      }
    },
    async stop() {
      service?.stop();
      await limiter.stop();
      controller.stop();
    },
  };
}
