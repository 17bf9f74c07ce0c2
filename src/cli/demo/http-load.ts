import { Agent, request } from 'node:http';
import { createVaryingLoad, type VaryingLoad } from './load.js';
import type { DemoStream } from './plan.js';

/** Responses by outcome since the start; `skipped`: not sent because too many were in flight. */
export interface HttpLoadCounts {
  sent: number;
  ok: number;
  limited: number;
  failed: number;
  skipped: number;
}

export interface HttpLoadOptions {
  streams: readonly DemoStream[];
  /** Proxy addresses (host:port) and the share of the load each gets. */
  targets: readonly { address: string; weight: number }[];
  startedAtMs: number;
  scale: number;
  /** Requests in flight past this are skipped and counted, so a stalled proxy cannot pile up sockets. */
  maxInFlight?: number;
  random?: () => number;
}

/**
 * The demo's clients: HTTP requests through the sidecar proxies at the plan's changing rates, each
 * stream's requests spread over the proxies by weight. Keep-alive connections, nothing awaited per
 * request: a request's outcome is counted when its response ends.
 */
export function createHttpLoad(options: HttpLoadOptions): VaryingLoad & {
  counts: HttpLoadCounts;
  close(): void;
} {
  const maxInFlight = options.maxInFlight ?? 512;
  const random = options.random ?? Math.random;
  const agent = new Agent({ keepAlive: true, maxSockets: 64 });
  const counts: HttpLoadCounts = { sent: 0, ok: 0, limited: 0, failed: 0, skipped: 0 };
  const totalWeight = options.targets.reduce((n, t) => n + t.weight, 0);
  const targets = options.targets.map((t) => {
    const at = t.address.lastIndexOf(':');
    return {
      host: t.address.slice(0, at).replace(/^\[|\]$/g, ''),
      port: Number(t.address.slice(at + 1)),
      weight: t.weight,
    };
  });
  let inFlight = 0;

  const pick = () => {
    let left = random() * totalWeight;
    for (const target of targets) {
      left -= target.weight;
      if (left < 0) return target;
    }
    return targets.at(-1)!;
  };

  const send = (stream: DemoStream) => {
    if (inFlight >= maxInFlight) {
      counts.skipped++;
      return;
    }
    const target = pick();
    inFlight++;
    counts.sent++;
    let settled = false;
    const settle = (outcome: 'ok' | 'limited' | 'failed') => {
      if (settled) return;
      settled = true;
      inFlight--;
      counts[outcome]++;
    };
    const req = request(
      {
        agent,
        host: target.host,
        port: target.port,
        path: stream.path,
        headers: stream.caller ? { 'x-caller': stream.caller } : {},
      },
      (response) => {
        const status = response.statusCode ?? 0;
        response.resume();
        response.once('end', () => settle(status === 429 ? 'limited' : status < 400 ? 'ok' : 'failed'));
        response.once('error', () => settle('failed'));
      },
    );
    req.setTimeout(10_000, () => req.destroy(new Error('timeout')));
    req.once('error', () => settle('failed'));
    req.end();
  };

  const load = createVaryingLoad(
    options.streams.map((stream) => ({
      rateAt: (tS: number) => stream.rateAt(tS) * options.scale,
      offer: () => send(stream),
    })),
    { startedAtMs: options.startedAtMs },
  );
  return {
    ...load,
    counts,
    close() {
      load.stop();
      agent.destroy();
    },
  };
}
