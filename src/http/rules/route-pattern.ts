/**
 * Route patterns for proxy rules: `/v1/payments/:id`, `/v1/payments/:id/refunds`, `/static/*`.
 *
 * - A literal segment matches itself, ignoring ASCII letter case unless `caseSensitive`.
 * - `:name` matches one non-empty segment and captures it as parameter `name` (as sent: a
 *   parameter's case is the upstream's business, like an id's).
 * - A final `*` matches the rest of the path, zero or more segments.
 *
 * Matching runs on `normalizeRequestPath(url)`, never on the raw target: `/v1//payments/1`,
 * `/v1/./payments/1`, `/v1/x/../payments/1`, `/v1\\payments\\1`, `/v1;x=1/payments/1`,
 * `/V1/Payments/1` and `/v1/%70ayments/1` all reach the same handler on common upstreams, so a
 * limiter that matched the raw text could be bypassed by spelling a path differently. For a rate
 * limiter matching too many spellings is the safe failure, too few a bypass. The request is still
 * forwarded with its original target.
 */
export interface RoutePattern {
  readonly source: string;
  readonly paramNames: readonly string[];
  /** The captured parameters when `path` (already normalized) matches, else undefined. */
  match(path: string): Record<string, string> | undefined;
}

/** A `match.prefix`: whole segments, `/v1` matches `/v1` and `/v1/x`, not `/v1x`. */
export interface PathPrefix {
  readonly source: string;
  /** Whether `path` (already normalized) starts with the prefix. */
  matches(path: string): boolean;
}

/** How the upstream routes, as far as matching needs to know (the rules file's `routing`). */
export interface PathMatching {
  /** Literal segments and prefixes compare ASCII letter case. Default false (Express, ASP.NET). */
  readonly caseSensitive: boolean;
  /** `;…` is cut from each segment before matching (Tomcat, Spring, Jetty). Default true. */
  readonly stripPathParameters: boolean;
}

export const DEFAULT_PATH_MATCHING: PathMatching = Object.freeze({
  caseSensitive: false,
  stripPathParameters: true,
});

type Segment = { kind: 'literal'; text: string } | { kind: 'param'; name: string } | { kind: 'rest' };

/** Throws a plain Error with a message suitable for a config issue. */
export function compileRoutePattern(source: string, matching = DEFAULT_PATH_MATCHING): RoutePattern {
  checkPathSource(source, matching);
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
  checkPathSource(source, matching);
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

/** What a pattern or prefix could never match once requests are normalized. */
function checkPathSource(source: string, matching: PathMatching): void {
  if (!source.startsWith('/')) throw new Error(`"${source}" must start with "/"`);
  if (source.includes('\\'))
    throw new Error(`"${source}": "\\" never matches (requests match with "/" for it)`);
  if (matching.stripPathParameters && source.includes(';')) {
    throw new Error(
      `"${source}": ";" never matches: path parameters are cut from requests before matching (routing.stripPathParameters)`,
    );
  }
}

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

const UNRESERVED = /%(2[DdEe]|3[0-9]|4[1-9A-Fa-f]|5[0-9Aa]|5[Ff]|6[1-9A-Fa-f]|7[0-9Aa]|7[Ee])/g;

/**
 * The path of a request target as an upstream would route it: query dropped, `\` read as `/`
 * (the WHATWG URL parser's reading), percent-encoded unreserved characters decoded (RFC 3986
 * §6.2.2.2), path parameters (`;jsessionid=1`) cut from each segment unless
 * `stripPathParameters` is off, dot segments removed (after the cut, so `..;` is `..`, as on
 * Tomcat), repeated and trailing slashes dropped (`/v1/payments/` is `/v1/payments`, as most
 * routers treat it). Other percent-escapes (`%2F`, `%25`, `%3B`) are kept as they are,
 * upper-cased. Letter case is kept: patterns compare it (or not) themselves, so parameters
 * keep theirs. An absolute-form target (`http://host/path`) contributes its path. Never throws:
 * an unparsable target gives `/`.
 */
export function normalizeRequestPath(target: string | undefined, matching = DEFAULT_PATH_MATCHING): string {
  if (target === undefined || target === '') return '/';
  let path = target;
  const query = path.search(/[?#]/);
  if (query !== -1) path = path.slice(0, query);
  if (!path.startsWith('/')) {
    try {
      path = new URL(path).pathname;
    } catch {
      return '/';
    }
  }
  if (path.includes('\\')) path = path.replaceAll('\\', '/');
  path = path.replace(UNRESERVED, (encoded) => String.fromCharCode(Number.parseInt(encoded.slice(1), 16)));
  path = path.replace(/%[0-9a-f]{2}/gi, (encoded) => encoded.toUpperCase());
  const out: string[] = [];
  for (let part of path.split('/')) {
    if (matching.stripPathParameters) {
      const semicolon = part.indexOf(';');
      if (semicolon !== -1) part = part.slice(0, semicolon);
    }
    if (part === '' || part === '.') continue;
    if (part === '..') out.pop();
    else out.push(part);
  }
  return `/${out.join('/')}`;
}
