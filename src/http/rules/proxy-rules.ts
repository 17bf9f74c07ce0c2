import { z } from 'zod';
import { type LocatedIssue, parseLocatedYaml } from '../../config/located-yaml.js';
import { readConfigFile } from '../../config/read-config-file.js';
import type { ClientAddressOptions } from '../client-address.js';
import { createClientAddressResolver } from '../client-address.js';
import { POLICY_NAME_PATTERN, type RateLimitPolicy } from '../rate-limit-headers.js';
import { compileKeyTemplate, type KeyTemplate } from './key-template.js';
import {
  compilePathPrefix,
  compileRoutePattern,
  type PathPrefix,
  type RoutePattern,
} from './route-pattern.js';
import { resolveServerConfig, type ServerConfig, serverSchema } from './server-rules.js';

/**
 * The rules file of `spillway proxy`: where to forward, which limiter backend, and which buckets
 * each request is decided against. docs/proxy.md is the reference; examples/proxy-rules.yaml an
 * example. Unknown fields are errors, so a typo never silently disables a limit.
 */

const positiveInt = (max: number) => z.number().int().min(1).max(max);
const timeoutMs = z.number().int().min(0).max(86_400_000);

const upstreamSchema = z.strictObject({
  /** `http://host:port` (or `https://`), no path: the request target is forwarded as it came. */
  url: z.string().min(1),
  /** Pooled connections to the upstream, default 128. */
  connections: positiveInt(10_000).default(128),
  /**
   * Requests that wait for a pooled connection when all are busy, at most: past it, 503. Bounds
   * what a stalled upstream lets clients pile up in the proxy. 0: none wait.
   */
  maxQueued: z.number().int().min(0).max(1_000_000).default(1_024),
  /** No connection within this long: 504. At least 1 ms (undici reads 0 as its own 10 s default). */
  connectTimeoutMs: positiveInt(86_400_000).default(5_000),
  /** No response headers within this long: 504. 0 disables. */
  headersTimeoutMs: timeoutMs.default(30_000),
  /**
   * The upstream takes no request body bytes for this long while the proxy has some for it: 504
   * (nginx's proxy_send_timeout). 0 disables.
   */
  sendTimeoutMs: timeoutMs.default(60_000),
  /** No response body bytes for this long: the response is cut. 0 disables. */
  bodyTimeoutMs: timeoutMs.default(300_000),
  /** Send the client's Host header upstream instead of the upstream's own. Default false. */
  preserveHost: z.boolean().default(false),
});

const clientAddressSchema = z.strictObject({
  trustedProxies: z.array(z.string()).default([]),
  ipv6PrefixLength: z.number().int().min(0).max(128).default(64),
  ipv4PrefixLength: z.number().int().min(0).max(32).default(32),
});

const backendSchema = z.discriminatedUnion('kind', [
  z.strictObject({
    kind: z.literal('local'),
    /** Keys held per bucket (CLOCK eviction beyond it: expired keys first; docs/local-limiters.md). */
    maxKeys: positiveInt(10_000_000).default(100_000),
  }),
  z.strictObject({
    kind: z.literal('redis'),
    url: z.string().min(1),
    algorithm: z
      .enum(['fixed-window', 'sliding-log', 'sliding-counter', 'token-bucket'])
      .default('sliding-counter'),
    timeoutMs: positiveInt(60_000).default(50),
    failPolicy: z.enum(['open', 'closed']).default('open'),
    prefix: z
      .string()
      .regex(/^[^{}]+$/, 'must not contain { or }')
      .default('spillway-proxy'),
  }),
  z.strictObject({
    kind: z.literal('global'),
    aggregators: z.array(z.string().min(1)).min(1),
    zone: z.string().min(1),
    region: z.string().min(1).optional(),
    intervalMs: z.number().int().min(50).max(60_000).default(1_000),
    /**
     * What the proxy does with a bucket's ratio once its directive is stale (the control plane is
     * unreachable): docs/proxy.md. Absent: hold 3 intervals, then decay to 0 over 10 s.
     */
    stalePolicy: z
      .discriminatedUnion('kind', [
        z.strictObject({
          kind: z.literal('hold-then-decay'),
          /** Absent: 3 report intervals. */
          holdMs: z.number().int().min(0).max(3_600_000).optional(),
          decayMs: z.number().int().min(0).max(3_600_000).default(10_000),
        }),
        z.strictObject({ kind: z.literal('hold') }),
        z.strictObject({ kind: z.literal('open') }),
      ])
      .optional(),
    /**
     * The host-local burst guard (docs/global-data-plane.md, "Burst guard"): `{}` for its defaults,
     * absent or `false` for none. Off by default, as in the library.
     */
    burstGuard: z
      .union([
        z.literal(false),
        z.strictObject({
          slackRatio: z.number().min(0).max(10).optional(),
          burstWindowMs: z.number().positive().max(60_000).optional(),
          tripUnits: z.number().min(1).max(1e9).optional(),
          tripWindowMs: z.number().min(0).max(60_000).optional(),
          drainFactor: z.number().gt(1).max(100).optional(),
        }),
      ])
      .optional(),
  }),
]);

/**
 * How the upstream routes requests, so that every spelling reaching one of its handlers matches
 * the same buckets (docs/proxy.md, "Path spelling"). The defaults over-match: a limit that covers
 * a spelling the upstream treats as another route is the safe failure, one that misses a
 * spelling reaching the same handler a bypass.
 */
const routingSchema = z.strictObject({
  /** Literal path segments and prefixes compare ASCII letter case. */
  caseSensitive: z.boolean().default(false),
  /** `methods: [GET]` also matches HEAD, and `{method}` renders HEAD as GET: frameworks answer HEAD with the GET handler. */
  headMatchesGet: z.boolean().default(true),
  /** `\` may be read as `/` (the WHATWG URL parser): `/admin\x` also matches as `/admin/x`. */
  backslashAsSlash: z.boolean().default(true),
  /** `;params` may be cut from each path segment (Tomcat): `/admin;x/y` also matches as `/admin/y`. */
  stripPathParameters: z.boolean().default(true),
});

const matchSchema = z.strictObject({
  /** Methods (upper case) the bucket applies to; absent: all. */
  methods: z
    .array(z.string().regex(/^[A-Z]+$/, 'must be an upper-case method name'))
    .min(1)
    .optional(),
  /** Route pattern: `/v1/payments/:id`, `/static/*`. */
  path: z.string().min(1).optional(),
  /** Path prefix, matched on whole segments: `/v1` matches `/v1` and `/v1/x`, not `/v1x`. */
  prefix: z.string().min(1).optional(),
  /** Header that must be present (any value). */
  header: z.string().min(1).optional(),
});

const bucketSchema = z.strictObject({
  /** Policy name in RateLimit headers and metrics. */
  name: z.string().min(1).max(64).regex(POLICY_NAME_PATTERN, 'must be letters, digits, ".", "_", ":" or "-"'),
  /** Bucket key template (key-template.ts); default: the name (one bucket for all matching requests). */
  key: z.string().min(1).max(256).optional(),
  limit: z.number().gt(0).max(1e12),
  windowSec: z.number().gt(0).max(31_536_000),
  mode: z.enum(['enforce', 'shadow']).default('enforce'),
  /** Units each request costs, default 1. */
  cost: z.number().gt(0).max(1e12).default(1),
  match: matchSchema.default({}),
});

const rulesSchema = z.strictObject({
  version: z.literal(1),
  upstream: upstreamSchema,
  // `prefault`: an absent `server` is parsed as `{}`, so its defaults are written once (server-rules.ts).
  server: serverSchema.prefault({}),
  clientAddress: clientAddressSchema.default({
    trustedProxies: [],
    ipv6PrefixLength: 64,
    ipv4PrefixLength: 32,
  }),
  routing: routingSchema.default({
    caseSensitive: false,
    headMatchesGet: true,
    backslashAsSlash: true,
    stripPathParameters: true,
  }),
  backend: backendSchema,
  buckets: z.array(bucketSchema).max(64),
});

export type UpstreamConfig = z.output<typeof upstreamSchema>;
export { DEFAULT_BODY_MIN_BYTES_PER_SEC, type ServerConfig } from './server-rules.js';
export type BackendConfig = z.output<typeof backendSchema>;
export type RoutingConfig = z.output<typeof routingSchema>;
export type BucketConfig = z.output<typeof bucketSchema>;

/** A bucket ready to decide requests. */
export interface ProxyBucket {
  readonly config: BucketConfig;
  readonly policy: RateLimitPolicy;
  readonly shadow: boolean;
  readonly methods: ReadonlySet<string> | undefined;
  readonly route: RoutePattern | undefined;
  readonly prefix: PathPrefix | undefined;
  readonly requiredHeader: string | undefined;
  readonly key: KeyTemplate;
}

export interface ProxyRules {
  readonly upstream: UpstreamConfig;
  readonly server: ServerConfig;
  readonly clientAddress: ClientAddressOptions;
  readonly routing: RoutingConfig;
  readonly backend: BackendConfig;
  readonly buckets: readonly ProxyBucket[];
}

/** Parse and validate a rules file. Throws ERR_SPILLWAY_INVALID_CONFIG with `file:line:col: path: what`. */
export function parseProxyRules(text: string, fileName = '<rules>'): ProxyRules {
  return parseLocatedYaml(text, fileName, rulesSchema, checkRules);
}

export async function loadProxyRules(path: string): Promise<ProxyRules> {
  return parseProxyRules(await readConfigFile(path, { kind: 'rules file' }), path);
}

type RawRules = z.output<typeof rulesSchema>;

function checkRules(raw: RawRules): { value: ProxyRules } | { issue: LocatedIssue } {
  let url: URL;
  try {
    url = new URL(raw.upstream.url);
  } catch {
    return {
      issue: { path: ['upstream', 'url'], message: `"${withoutCredentials(raw.upstream.url)}" is not a URL` },
    };
  }
  if (
    (url.protocol !== 'http:' && url.protocol !== 'https:') ||
    url.pathname !== '/' ||
    url.search ||
    url.hash
  ) {
    return {
      issue: {
        path: ['upstream', 'url'],
        message: `must be http(s)://host[:port] with no path, query or credentials, got "${withoutCredentials(raw.upstream.url)}"`,
      },
    };
  }
  if (url.username || url.password) {
    return { issue: { path: ['upstream', 'url'], message: 'must not carry credentials' } };
  }
  const server = resolveServerConfig(raw.server);
  if ('issue' in server) return server;
  try {
    createClientAddressResolver(raw.clientAddress);
  } catch (error) {
    const index = raw.clientAddress.trustedProxies.findIndex((entry) => {
      try {
        createClientAddressResolver({ trustedProxies: [entry] });
        return false;
      } catch {
        return true;
      }
    });
    return {
      issue: {
        path: index === -1 ? ['clientAddress'] : ['clientAddress', 'trustedProxies', index],
        message: (error as Error).message.replace(/^trustedProxies: /, ''),
      },
    };
  }
  if (raw.backend.kind === 'redis') {
    try {
      const redisUrl = new URL(raw.backend.url);
      if (redisUrl.protocol !== 'redis:' && redisUrl.protocol !== 'rediss:') throw new Error('scheme');
    } catch {
      return {
        issue: {
          path: ['backend', 'url'],
          message: `must be redis://host:port or rediss://..., got "${withoutCredentials(raw.backend.url)}"`,
        },
      };
    }
  }
  if (raw.backend.kind === 'global') {
    for (const [index, target] of raw.backend.aggregators.entries()) {
      const port = Number(/^(?:\[[^\]]+\]|[^:\s[\]]+):(\d{1,5})$/.exec(target)?.[1]);
      if (!(port >= 1 && port <= 65_535)) {
        return {
          issue: { path: ['backend', 'aggregators', index], message: `must be host:port, got "${target}"` },
        };
      }
    }
  }
  const names = new Map<string, number>();
  const buckets: ProxyBucket[] = [];
  for (const [index, bucket] of raw.buckets.entries()) {
    const at = (field: (string | number)[], message: string) => ({
      issue: { path: ['buckets', index, ...field], message },
    });
    const first = names.get(bucket.name);
    if (first !== undefined)
      return at(['name'], `duplicate bucket name "${bucket.name}" (first at buckets[${first}])`);
    names.set(bucket.name, index);
    if (bucket.cost > bucket.limit)
      return at(['cost'], `must be at most limit (${bucket.limit}), got ${bucket.cost}`);
    const { match } = bucket;
    if (match.path !== undefined && match.prefix !== undefined) {
      return at(['match'], 'needs at most one of "path" and "prefix"');
    }
    let route: RoutePattern | undefined;
    if (match.path !== undefined) {
      try {
        route = compileRoutePattern(match.path, raw.routing);
      } catch (error) {
        return at(['match', 'path'], (error as Error).message);
      }
    }
    let prefix: PathPrefix | undefined;
    if (match.prefix !== undefined) {
      try {
        prefix = compilePathPrefix(match.prefix, raw.routing);
      } catch (error) {
        return at(['match', 'prefix'], (error as Error).message);
      }
    }
    if (match.header !== undefined && !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(match.header)) {
      return at(['match', 'header'], `"${match.header}" is not a header name`);
    }
    let key: KeyTemplate;
    try {
      key = compileKeyTemplate(bucket.key ?? bucket.name, route?.paramNames ?? [], raw.routing);
    } catch (error) {
      return at(['key'], (error as Error).message);
    }
    buckets.push({
      config: bucket,
      policy: { name: bucket.name, limit: bucket.limit, windowSec: bucket.windowSec },
      shadow: bucket.mode === 'shadow',
      methods: match.methods ? methodSet(match.methods, raw.routing) : undefined,
      route,
      prefix,
      requiredHeader: match.header?.toLowerCase(),
      key,
    });
  }
  return {
    value: {
      upstream: raw.upstream,
      server: server.value,
      clientAddress: raw.clientAddress,
      routing: raw.routing,
      backend: raw.backend,
      buckets,
    },
  };
}

function methodSet(methods: readonly string[], routing: RoutingConfig): ReadonlySet<string> {
  const set = new Set(methods);
  if (routing.headMatchesGet && set.has('GET')) set.add('HEAD');
  return set;
}

/**
 * A URL as an error message may quote it: any `user:password@` replaced by `***@`. Messages are
 * logged and served in /healthz (`lastReloadError`), and a Redis URL carries its password there.
 */
function withoutCredentials(url: string): string {
  return url.replace(/(\/\/)[^/?#\s]*@/, '$1***@');
}
