import type { IncomingMessage } from 'node:http';
import { createClientAddressResolver, createTrustedProxyMatcher } from '../client-address.js';
import type { EdgeLimiter } from '../limiter-adapter.js';
import type { ProxyBucket, ProxyRules } from '../rules/proxy-rules.js';
import { upstreamRequestHeaders } from './forward-headers.js';
import type { ProxyBackend } from './proxy-backend.js';

/**
 * A rules file ready to serve: each bucket's limiter and the client address readers. A request is
 * served to its end under the rules it arrived under, whatever a reload installs meanwhile.
 */
export interface ActiveRules {
  rules: ProxyRules;
  limiters: Map<ProxyBucket, EdgeLimiter>;
  resolveClient: (peer: string, forwardedFor: string | string[] | undefined) => string;
  isTrustedPeer: (peer: string) => boolean;
}

/** Throws when a bucket's limiter cannot be built. */
export function activateRules(rules: ProxyRules, backend: ProxyBackend): ActiveRules {
  const limiters = new Map<ProxyBucket, EdgeLimiter>();
  for (const bucket of rules.buckets) limiters.set(bucket, backend.limiterFor(bucket));
  return {
    rules,
    limiters,
    resolveClient: createClientAddressResolver(rules.clientAddress),
    isTrustedPeer: createTrustedProxyMatcher(rules.clientAddress.trustedProxies),
  };
}

/** The fields a request (or an upgrade) goes to the upstream with: see `upstreamRequestHeaders`. */
export function forwardedRequestHeaders(
  req: IncomingMessage,
  rules: ActiveRules,
  preserveHost: boolean,
): Record<string, string | string[]> {
  const peer = req.socket.remoteAddress;
  return upstreamRequestHeaders(req.headers, {
    peerAddress: peer,
    peerTrusted: peer !== undefined && rules.isTrustedPeer(peer),
    protocol: 'http',
    preserveHost,
  });
}
