/**
 * Route patterns for proxy rules: `/v1/payments/:id`, `/v1/payments/:id/refunds`, `/static/*`.
 *
 * - A literal segment matches itself exactly (case-sensitive).
 * - `:name` matches one non-empty segment and captures it as parameter `name`.
 * - A final `*` matches the rest of the path, zero or more segments.
 *
 * Matching runs on `normalizeRequestPath(url)`, never on the raw target: `/v1//payments/1`,
 * `/v1/./payments/1`, `/v1/x/../payments/1` and `/v1/%70ayments/1` all reach the same handler on
 * most upstreams, so a limiter that matched the raw text could be bypassed by spelling a path
 * differently. The request is still forwarded with its original target.
 */
export interface RoutePattern {
  readonly source: string;
  readonly paramNames: readonly string[];
  /** The captured parameters when `path` (already normalized) matches, else undefined. */
  match(path: string): Record<string, string> | undefined;
}

type Segment = { kind: 'literal'; text: string } | { kind: 'param'; name: string } | { kind: 'rest' };

/** Throws a plain Error with a message suitable for a config issue. */
export function compileRoutePattern(source: string): RoutePattern {
  if (!source.startsWith('/')) throw new Error(`"${source}" must start with "/"`);
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
      segments.push({ kind: 'literal', text: part });
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
          if (part !== segment.text) return undefined;
        } else {
          if (part === '') return undefined;
          params[segment.name] = part;
        }
      }
      return pathParts.length === segments.length ? params : undefined;
    },
  };
}

const UNRESERVED = /%(2[DdEe]|3[0-9]|4[1-9A-Fa-f]|5[0-9Aa]|5[Ff]|6[1-9A-Fa-f]|7[0-9Aa]|7[Ee])/g;

/**
 * The path of a request target as an upstream would route it: query dropped, percent-encoded
 * unreserved characters decoded (RFC 3986 §6.2.2.2), dot segments removed, repeated and trailing slashes
 * dropped (`/v1/payments/` is `/v1/payments`, as most routers treat it). Other percent-escapes (`%2F`, `%25`) are kept as they are, upper-cased. An absolute-form
 * target (`http://host/path`) contributes its path. Never throws: an unparsable target gives `/`.
 */
export function normalizeRequestPath(target: string | undefined): string {
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
  path = path.replace(UNRESERVED, (encoded) => String.fromCharCode(Number.parseInt(encoded.slice(1), 16)));
  path = path.replace(/%[0-9a-f]{2}/gi, (encoded) => encoded.toUpperCase());
  const out: string[] = [];
  for (const part of path.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') out.pop();
    else out.push(part);
  }
  return `/${out.join('/')}`;
}
