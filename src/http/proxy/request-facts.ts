import type { IncomingMessage } from 'node:http';
import type { RequestFacts } from '../rules/match-buckets.js';
import { type PathRewrites, requestPathReadings } from '../rules/route-pattern.js';
import type { ActiveRules } from './active-rules.js';

/**
 * What bucket matching reads from a request, each computed on first use: a rule set whose keys
 * and matches need neither the path readings nor the client address never computes them.
 */
export class LazyRequestFacts implements RequestFacts {
  readonly method: string;
  #pathReadings: readonly string[] | undefined = undefined;
  #clientKey: string | undefined = undefined;
  /** Called detached (`context.header(name)` in key templates), so it does not read `this`. */
  readonly header: (name: string) => string | undefined;
  readonly #req: IncomingMessage;
  readonly #resolveClient: ActiveRules['resolveClient'];
  readonly #routing: PathRewrites;

  constructor(req: IncomingMessage, resolveClient: ActiveRules['resolveClient'], routing: PathRewrites) {
    this.#req = req;
    this.#resolveClient = resolveClient;
    this.#routing = routing;
    this.method = req.method ?? 'GET';
    this.header = (name) => headerValue(req, name);
  }

  get paths(): readonly string[] {
    if (this.#pathReadings === undefined)
      this.#pathReadings = requestPathReadings(this.#req.url, this.#routing);
    return this.#pathReadings;
  }

  /**
   * From `rawHeaders`, as `headers` joins repeated lines (or keeps only the first, for
   * `authorization` and the like). One pass over the lines, no allocation; none at all for a
   * request without the header.
   */
  headerRepeated(name: string): boolean {
    if (this.#req.headers[name] === undefined) return false;
    const raw = this.#req.rawHeaders;
    let seen = false;
    for (let i = 0; i < raw.length; i += 2) {
      if (!sameHeaderName(raw[i]!, name)) continue;
      if (seen) return true;
      seen = true;
    }
    return false;
  }

  get client(): string {
    if (this.#clientKey === undefined) {
      this.#clientKey = this.#resolveClient(
        this.#req.socket.remoteAddress ?? '',
        this.#req.headers['x-forwarded-for'],
      );
    }
    return this.#clientKey;
  }
}

/** A header's value (lower-case name), repeated lines joined with `, `. */
export function headerValue(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  if (typeof value === 'string') return value;
  // Not `undefined` alone: `req.headers` is a plain object, whose `__proto__` is no header.
  return Array.isArray(value) ? value.join(', ') : undefined;
}

/** `raw` (as sent) is `lowerCaseName` ignoring ASCII letter case; allocates nothing. */
function sameHeaderName(raw: string, lowerCaseName: string): boolean {
  if (raw.length !== lowerCaseName.length) return false;
  for (let i = 0; i < raw.length; i++) {
    let code = raw.charCodeAt(i);
    if (code >= 0x41 && code <= 0x5a) code += 0x20;
    if (code !== lowerCaseName.charCodeAt(i)) return false;
  }
  return true;
}
