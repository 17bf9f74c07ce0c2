import type { ProxyBucket } from './proxy-rules.js';
import type { PathPrefix, RoutePattern } from './route-pattern.js';

/** What bucket matching reads from a request. */
export interface RequestFacts {
  method: string;
  /**
   * From `requestPathReadings`: every path an upstream may route the request to, most rewritten
   * first; one for a path without `;`, `\`, `//` or a dot segment.
   */
  paths: readonly string[];
  /** From the client address resolver. */
  client: string;
  /** A header's value (lower-case name); repeated headers joined with `, `. */
  header(name: string): string | undefined;
  /** Whether the header (lower-case name) came on more than one line. */
  headerRepeated(name: string): boolean;
}

/** Shared by buckets without a route pattern (no parameters); never written to. */
const NO_PARAMS: Record<string, string> = Object.freeze({}) as Record<string, string>;

export interface MatchedBucket {
  bucket: ProxyBucket;
  key: string;
}

/**
 * Every bucket whose `match` accepts the request, in rules-file order, each with its rendered key.
 * A bucket with no `match` fields applies to every request. A path or prefix matches when any
 * reading of the request path does; the bucket is listed (and so charged) once, with the
 * parameters of the first reading its route matches.
 */
export function matchBuckets(buckets: readonly ProxyBucket[], request: RequestFacts): MatchedBucket[] {
  const matched: MatchedBucket[] = [];
  for (const bucket of buckets) {
    if (bucket.methods !== undefined && !bucket.methods.has(request.method)) continue;
    if (bucket.requiredHeader !== undefined && request.header(bucket.requiredHeader) === undefined) continue;
    let params: Record<string, string> = NO_PARAMS;
    let route = '';
    if (bucket.route !== undefined) {
      const captured = firstRouteMatch(bucket.route, request.paths);
      if (captured === undefined) continue;
      params = captured;
      route = bucket.route.source;
    } else if (bucket.prefix !== undefined) {
      if (!anyPrefixMatch(bucket.prefix, request.paths)) continue;
      route = bucket.prefix.source;
    }
    // A constant key (the default: the bucket name) reads nothing from the request.
    const key =
      bucket.key.constant ??
      bucket.key.render({
        client: request.client,
        method: request.method,
        route,
        params,
        header: request.header,
      });
    matched.push({ bucket, key });
  }
  return matched;
}

function firstRouteMatch(route: RoutePattern, paths: readonly string[]): Record<string, string> | undefined {
  for (const path of paths) {
    const captured = route.match(path);
    if (captured !== undefined) return captured;
  }
  return undefined;
}

function anyPrefixMatch(prefix: PathPrefix, paths: readonly string[]): boolean {
  for (const path of paths) if (prefix.matches(path)) return true;
  return false;
}

/**
 * A header that a matched enforcing bucket's key reads and the request sent on more than one line
 * or as a comma-separated list on one, else undefined. Such a request is ambiguous: Node joins the
 * lines into one value (`A, A`, a key of its own), which is what the upstream then receives and
 * may read as a list (its first or last member: `A`), so the caller a key names need not be the
 * one the upstream serves; `A, x1` on one line is the same list (RFC 9110 §5.3), and rotating its
 * second member would give every request a key of its own. The proxy refuses both rather than guess.
 */
export function repeatedKeyHeader(
  matched: readonly MatchedBucket[],
  request: RequestFacts,
): string | undefined {
  for (const { bucket } of matched) {
    // A shadow bucket never answers a client: it counts the joined value as a key of its own.
    if (bucket.shadow) continue;
    for (const name of bucket.key.headers) {
      if (request.headerRepeated(name) || request.header(name)?.includes(',')) return name;
    }
  }
  return undefined;
}
