/**
 * Route patterns for proxy rules: `/v1/payments/:id`, `/v1/payments/:id/refunds`, `/static/*`.
 *
 * - A literal segment matches itself, ignoring ASCII letter case unless `caseSensitive`.
 * - `:name` matches one non-empty segment and captures it as parameter `name` (as sent: a
 *   parameter's case is the upstream's business, like an id's).
 * - A final `*` matches the rest of the path, zero or more segments.
 *
 * Matching runs on the readings of `requestPathReadings(url)`, never on the raw target:
 * `/v1//payments/1`, `/v1/./payments/1`, `/v1/x/../payments/1`, `/v1\\payments\\1`,
 * `/v1;x=1/payments/1`, `/V1/Payments/1` and `/v1/%70ayments/1` all reach the same handler on
 * some common upstream, and `/v1/payments/../refunds` or `//evil/v1/payments/1` reach other
 * handlers on others, so a limiter that matched the raw text (or any single reading) could be
 * bypassed by spelling a path differently. For a rate limiter matching too many spellings is the safe failure, too few a
 * bypass. The request is still forwarded with its original target.
 */
export interface RoutePattern {
  readonly source: string;
  readonly paramNames: readonly string[];
  /** The captured parameters when `path` (one normalized reading) matches, else undefined. */
  match(path: string): Record<string, string> | undefined;
}

/** A `match.prefix`: whole segments, `/v1` matches `/v1` and `/v1/x`, not `/v1x`. */
export interface PathPrefix {
  readonly source: string;
  /** Whether `path` (one normalized reading) starts with the prefix. */
  matches(path: string): boolean;
}

/**
 * Rewrites some upstreams apply to a path before routing it and others do not (the rules file's
 * `routing`). Each one enabled adds readings of a path that contains its character; it never
 * removes the reading without it (see `requestPathReadings`).
 */
export interface PathRewrites {
  /** `\` may be read as `/`, as the WHATWG URL parser does. Default true. */
  readonly backslashAsSlash: boolean;
  /** `;…` may be cut from each segment, as Tomcat, Spring and Jetty do. Default true. */
  readonly stripPathParameters: boolean;
}

/** How the upstream routes, as far as matching needs to know (the rules file's `routing`). */
export interface PathMatching extends PathRewrites {
  /** Literal segments and prefixes compare ASCII letter case. Default false (Express, ASP.NET). */
  readonly caseSensitive: boolean;
}

export const DEFAULT_PATH_MATCHING: PathMatching = Object.freeze({
  caseSensitive: false,
  backslashAsSlash: true,
  stripPathParameters: true,
});

type Segment = { kind: 'literal'; text: string } | { kind: 'param'; name: string } | { kind: 'rest' };

/** Throws a plain Error with a message suitable for a config issue. */
export function compileRoutePattern(source: string, matching = DEFAULT_PATH_MATCHING): RoutePattern {
  checkPathSource(source, matching, 'path');
  // A trailing slash is ignored, as it is in normalized request paths.
  const trimmed = source.length > 1 && source.endsWith('/') ? source.slice(0, -1) : source;
  const parts = trimmed === '/' ? [] : trimmed.slice(1).split('/');
  const segments: Segment[] = [];
  const paramNames: string[] = [];
  for (const [index, part] of parts.entries()) {
    if (part === '*') {
      if (index !== parts.length - 1) throw new Error(`"${source}": "*" is only allowed as the last segment`);
      segments.push({ kind: 'rest' });
    } else if (part.startsWith(':')) {
      const name = part.slice(1);
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name))
        throw new Error(`"${source}": bad parameter name "${part}"`);
      // Captured into a plain object, where this name is its prototype, not a property.
      if (name === '__proto__') throw new Error(`"${source}": parameter name ":__proto__" is reserved`);
      if (paramNames.includes(name)) throw new Error(`"${source}": parameter ":${name}" appears twice`);
      paramNames.push(name);
      segments.push({ kind: 'param', name });
    } else {
      if (part === '') throw new Error(`"${source}": empty segment`);
      if (part.includes('*') || part.includes(':')) {
        throw new Error(`"${source}": "*" and ":" must make up a whole segment`);
      }
      segments.push({ kind: 'literal', text: matching.caseSensitive ? part : part.toLowerCase() });
    }
  }
  return {
    source,
    paramNames,
    match(path) {
      const pathParts = path === '/' ? [] : path.slice(1).split('/');
      const params: Record<string, string> = {};
      for (let i = 0; i < segments.length; i++) {
        const segment = segments[i]!;
        if (segment.kind === 'rest') return params;
        const part = pathParts[i];
        if (part === undefined) return undefined;
        if (segment.kind === 'literal') {
          if (!sameText(part, segment.text, matching.caseSensitive)) return undefined;
        } else {
          if (part === '') return undefined;
          params[segment.name] = part;
        }
      }
      return pathParts.length === segments.length ? params : undefined;
    },
  };
}

/** Throws a plain Error with a message suitable for a config issue. */
export function compilePathPrefix(source: string, matching = DEFAULT_PATH_MATCHING): PathPrefix {
  checkPathSource(source, matching, 'prefix');
  const trimmed = source.replace(/\/+$/, '');
  const prefix = matching.caseSensitive ? trimmed : trimmed.toLowerCase();
  return {
    source,
    matches(path) {
      if (prefix === '') return true;
      if (path.length < prefix.length) return false;
      if (path.length > prefix.length && path.charCodeAt(prefix.length) !== SLASH) return false;
      return matching.caseSensitive ? path.startsWith(prefix) : startsWithFolded(path, prefix);
    },
  };
}

/**
 * What a pattern or prefix must not contain. A `\` or `;` in one would match only the plain
 * reading of a request, while an upstream that applies the rewrite routes the rewritten
 * spelling (`/a/b` for `/a\b`, `/a/b` for `/a;v=1/b`) to the same handler: a bypass.
 */
function checkPathSource(source: string, matching: PathMatching, kind: 'path' | 'prefix'): void {
  if (!source.startsWith('/')) throw new Error(`"${source}" must start with "/"`);
  // OpenAPI's `{id}` (and Express 5's `{/:id}` optional groups): as literal text they match nothing
  // a client sends (clients escape braces as %7B and %7D), so the bucket would silently limit nothing.
  const braces = /\{[^}]*\}?|\}/.exec(source);
  if (braces !== null) {
    const name = /^\{:?([A-Za-z_][A-Za-z0-9_]*)\}$/.exec(braces[0])?.[1];
    throw new Error(
      kind === 'path'
        ? `"${source}": "${braces[0]}" is not route pattern syntax (OpenAPI's braces match nothing here): write a parameter as ${name === undefined ? '":name"' : `":${name}"`} (one whole segment), and a final "*" for the rest of the path`
        : `"${source}": "${braces[0]}" is not prefix syntax: a prefix is literal segments; for a parameter use match.path with ${name === undefined ? '":name"' : `":${name}"`}`,
    );
  }
  if (matching.backslashAsSlash && source.includes('\\')) {
    throw new Error(`"${source}": "\\" is read as "/" in requests (routing.backslashAsSlash): write "/"`);
  }
  if (matching.stripPathParameters && source.includes(';')) {
    throw new Error(
      `"${source}": ";" starts a path parameter, cut from requests (routing.stripPathParameters): write the path without it`,
    );
  }
  // Requests are normalized before matching; a pattern spelled in a form no reading takes would
  // never match, silently. The same rules as normalizePath, refused instead of applied.
  const trimmed = source.replace(/\/+$/, '');
  if (trimmed.includes('//')) throw new Error(`"${source}": empty segment (requests drop them)`);
  for (const segment of trimmed.split('/')) {
    if (segment === '.' || segment === '..') {
      throw new Error(`"${source}": "${segment}" is resolved in requests: write the path it leads to`);
    }
    const unreserved = UNRESERVED_ESCAPE.exec(segment);
    if (unreserved !== null) {
      const character = String.fromCharCode(Number.parseInt(unreserved[0].slice(1), 16));
      throw new Error(`"${source}": "${unreserved[0]}" is decoded in requests: write "${character}"`);
    }
    const lowerCase = LOWER_CASE_ESCAPE.exec(segment);
    if (lowerCase !== null) {
      throw new Error(
        `"${source}": "${lowerCase[0]}": requests are compared with percent-escapes in upper case: write "${lowerCase[0].toUpperCase()}"`,
      );
    }
  }
}

/** A percent-escape with a lower-case hex digit, which normalization upper-cases. */
const LOWER_CASE_ESCAPE = /%([0-9A-Fa-f][a-f]|[a-f][0-9A-Fa-f])/;

const SLASH = 0x2f;

function sameText(part: string, text: string, caseSensitive: boolean): boolean {
  if (caseSensitive) return part === text;
  return part.length === text.length && startsWithFolded(part, text);
}

/** `text` starts with `folded` (lower case) ignoring ASCII letter case; allocates nothing. */
function startsWithFolded(text: string, folded: string): boolean {
  for (let i = 0; i < folded.length; i++) {
    let code = text.charCodeAt(i);
    if (code >= 0x41 && code <= 0x5a) code += 0x20;
    if (code !== folded.charCodeAt(i)) return false;
  }
  return true;
}

/** A percent-escape of an unreserved character (`%70` for `p`), which normalization decodes. */
const UNRESERVED_ESCAPE = /%(2[DdEe]|3[0-9]|4[1-9A-Fa-f]|5[0-9Aa]|5[Ff]|6[1-9A-Fa-f]|7[0-9Aa]|7[Ee])/;
const UNRESERVED = new RegExp(UNRESERVED_ESCAPE.source, 'g');

/**
 * Every path an upstream may route a request target to; a bucket matches when any of them does.
 *
 * Upstreams disagree on `\`, `;`, dot segments and `//`: Express, Fastify, Go and nginx keep `\`
 * and `;` as characters, the WHATWG URL parser (fetch-API servers, `new URL(req.url, base)`)
 * reads `\` as `/`, Tomcat, Spring and Jetty cut `;params`. A rewrite applied before dot segments
 * are resolved can turn a segment into `..` or nothing and so remove a real segment that an
 * upstream not applying it keeps: `/files/..;/x` is `/x` on Tomcat but reaches `/files/*` on
 * Express. No single reading is safe, so each enabled rewrite whose character the path contains
 * is applied and not applied.
 *
 * Readings, duplicates dropped, at most seven:
 * 1. every rewrite applied (`\` first, then `;` cut); then, with both characters, `;` cut only
 *    and `\` as `/` only, as an upstream may apply one and not the other (`/files\x/..;/..` is
 *    `/files/x` to the WHATWG parser, `/` fully rewritten, `/files\x` plainly);
 * 2. the plain reading (neither rewrite), if the path has `\` or `;`;
 * 3. with `backslashAsSlash` and a path containing `\` or `//`: the WHATWG parser's own pathname,
 *    normalized plainly. It reads `//evil/v1/x` and `/\evil/v1/x` as host `evil` and path
 *    `/v1/x`, and counts empty segments when resolving `..` (`/v1//../x` is `/v1/x`), which
 *    the other readings, dropping empty segments first, do not;
 * 4. with a dot segment (`.`, `..`, `%2e`, `.%2E`…): the plain reading with dot segments kept as
 *    segments (escapes decoded), as Express 5 and Fastify 5 route them: `/admin/../users`
 *    reaches their `/admin` handler, `/v1/payments/%2E%2E/refunds` their
 *    `/v1/payments/:id/refunds` with id `..`;
 * 5. with `stripPathParameters` and a `;`: the path cut at its first `;`, dot segments kept, as
 *    Fastify with `useSemicolonDelimiter` routes it (everything from the `;` is its query):
 *    `/v1/payments/1;x/../../admin` reaches its `/v1/payments/:id` handler with id `1`.
 *
 * In that order, because a bucket's parameters come from the first reading it matches: most
 * rewritten first (`/items/42;v=2` gives `42`, the key of `/items/42`: one budget for what may be
 * one id is the safe failure), and the readings of 3 to 5 last, so they never change the key of
 * a request that an earlier reading matches. A path with none of `\`, `;`, `//` or a dot segment,
 * the common case, has one reading and is normalized once.
 */
export function requestPathReadings(
  target: string | undefined,
  rewrites: PathRewrites = DEFAULT_PATH_MATCHING,
): readonly string[] {
  const path = targetPath(target);
  const backslash = rewrites.backslashAsSlash && path.includes('\\');
  const semicolon = rewrites.stripPathParameters && path.includes(';');
  const whatwg = rewrites.backslashAsSlash && (backslash || path.includes('//'));
  const dots = (path.includes('/.') || path.includes('%2')) && DOT_SEGMENT.test(path);
  if (!backslash && !semicolon && !whatwg && !dots) return [normalizePath(path, false, false)];
  const readings = [normalizePath(path, backslash, semicolon)];
  if (backslash && semicolon) {
    addReading(readings, normalizePath(path, false, true));
    addReading(readings, normalizePath(path, true, false));
  }
  if (backslash || semicolon) addReading(readings, normalizePath(path, false, false));
  if (whatwg) {
    const parsed = whatwgPathname(path);
    if (parsed !== undefined) addReading(readings, normalizePath(parsed, false, false));
  }
  if (dots) addReading(readings, normalizePath(path, false, false, true));
  if (semicolon) addReading(readings, normalizePath(path.slice(0, path.indexOf(';')), false, false, true));
  return readings;
}

/** A `/`-delimited segment of one or two dots, each `.` or `%2e` in either case. */
const DOT_SEGMENT = /\/(?:\.|%2e){1,2}(?=\/|$)/i;

const WHATWG_BASE = new URL('http://h/');

/**
 * The pathname the WHATWG URL parser gives a request target, as `new URL(req.url, base)` in an
 * upstream does: `//host/…` and `/\host/…` are an authority and a path. Undefined when the parser
 * rejects it (a bad host), as the upstream's parse then fails too.
 */
function whatwgPathname(path: string): string | undefined {
  try {
    return new URL(path, WHATWG_BASE).pathname;
  } catch {
    return undefined;
  }
}

/**
 * One reading of a request target's path (every rewrite in `rewrites` applied): query dropped,
 * `\` read as `/` if `backslashAsSlash`, percent-encoded unreserved characters decoded (RFC 3986
 * §6.2.2.2), path parameters (`;jsessionid=1`) cut from each segment if `stripPathParameters`,
 * dot segments removed (after the cut, so `..;` is `..`, as on Tomcat), repeated and trailing
 * slashes dropped (`/v1/payments/` is `/v1/payments`, as most routers treat it). Other
 * percent-escapes (`%2F`, `%25`, `%3B`, `%5C`) are kept as they are, upper-cased. Letter case is
 * kept: patterns compare it (or not) themselves, so parameters keep theirs. An absolute-form
 * target (`http://host/path`) contributes its path. Never throws: an unparsable target gives `/`.
 */
export function normalizeRequestPath(
  target: string | undefined,
  rewrites: PathRewrites = DEFAULT_PATH_MATCHING,
): string {
  return normalizePath(targetPath(target), rewrites.backslashAsSlash, rewrites.stripPathParameters);
}

/** The path of a request target, query dropped; `/` for an empty or unparsable one. */
function targetPath(target: string | undefined): string {
  if (target === undefined || target === '') return '/';
  let path = target;
  const query = path.search(/[?#]/);
  if (query !== -1) path = path.slice(0, query);
  if (path.startsWith('/')) return path;
  try {
    return new URL(path).pathname;
  } catch {
    return '/';
  }
}

function normalizePath(
  path: string,
  backslashAsSlash: boolean,
  stripPathParameters: boolean,
  keepDotSegments = false,
): string {
  let text = backslashAsSlash && path.includes('\\') ? path.replaceAll('\\', '/') : path;
  text = text.replace(UNRESERVED, (encoded) => String.fromCharCode(Number.parseInt(encoded.slice(1), 16)));
  text = text.replace(/%[0-9a-f]{2}/gi, (encoded) => encoded.toUpperCase());
  const out: string[] = [];
  for (let part of text.split('/')) {
    if (stripPathParameters) {
      const semicolon = part.indexOf(';');
      if (semicolon !== -1) part = part.slice(0, semicolon);
    }
    if (part === '') continue;
    if (keepDotSegments) out.push(part);
    else if (part === '..') out.pop();
    else if (part !== '.') out.push(part);
  }
  return `/${out.join('/')}`;
}

function addReading(readings: string[], reading: string): void {
  if (!readings.includes(reading)) readings.push(reading);
}
