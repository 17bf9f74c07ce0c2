import { createHash } from 'node:crypto';

/**
 * Bucket key templates: `payments:caller={header:x-api-key}`, `search:client={client}`.
 *
 * | placeholder | value |
 * |---|---|
 * | `{client}` | the client address key from client-address.ts (`203.0.113.7`, `2001:db8:1:2::/64`) |
 * | `{method}` | the request method, upper case; HEAD renders as GET under `headMatchesGet` (one handler, one budget) |
 * | `{route}` | the bucket's matched route pattern or prefix, as written in the rules |
 * | `{param:id}` | a `:id` segment captured by the bucket's route pattern |
 * | `{header:x-api-key}` | the header's value |
 * | `{headerHash:x-api-key}` | the first 16 hex digits of the value's SHA-256: keeps secrets out of keys, logs and the controller |
 *
 * A value made of anything but `[A-Za-z0-9._~:@/+=-]`, or longer than 128 characters, is replaced by
 * `h.` and its hash prefix, so a hostile header cannot inject separators or blow up key length.
 * Several placeholders can still add up past what a limiter takes (the global limiter's keys are at
 * most 256 bytes, the others' 512 characters; a limiter that refuses a key would admit the
 * request): a rendered key over `MAX_KEY_BYTES` is folded to the template's leading text, `~h.`
 * and 32 hex digits of the whole key's SHA-256, still one key per distinct value. A
 * missing value renders as `-`: every request without the header shares one bucket (omitting
 * the header is never a way around the limit). A header sent on more than one line has no one value
 * (upstreams differ on which they read): the proxy refuses such a request before any bucket is
 * charged (`repeatedKeyHeader` in match-buckets.ts), so the joined value `header()` gives for it
 * is never an enforcing bucket's key (a shadow bucket, which never answers, counts it as one).
 *
 * No placeholder renders the request path itself: `{route}` is the pattern as written and a
 * `{param}` is read from the normalized path, so spellings of one path (`/V1/x`, `/v1;a/x`,
 * `/v1\x`) that match one route also render one key.
 */
export interface KeyContext {
  client: string;
  method: string;
  route: string;
  params: Record<string, string>;
  header(name: string): string | undefined;
}

export interface KeyTemplateOptions {
  /** `{method}` renders HEAD as GET. */
  readonly headMatchesGet: boolean;
}

export interface KeyTemplate {
  readonly source: string;
  /** The key every request renders when the template has no placeholder; undefined otherwise. */
  readonly constant: string | undefined;
  /** Header names (lower case) the template reads. */
  readonly headers: readonly string[];
  render(context: KeyContext): string;
  /**
   * Whether `key` could be one this template renders: its literal text in place, any non-empty
   * text for each placeholder (or the folded form of a long key). For telling which rule a
   * limiter's bucket belongs to, off the request path.
   */
  matches(key: string): boolean;
}

const MISSING = '-';
const MAX_VALUE_LENGTH = 128;
/** Under every limiter's key bound (the global limiter's default, 256 bytes, is the smallest). */
export const MAX_KEY_BYTES = 200;
/** Of the template's leading text, what a folded key keeps (at most 3 bytes each in UTF-8). */
const FOLDED_HEAD_LENGTH = 48;
const SAFE_VALUE = /^[A-Za-z0-9._~:@/+=-]+$/;
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

type Part = string | ((context: KeyContext) => string);

/** Throws a plain Error with a message suitable for a config issue. */
export function compileKeyTemplate(
  source: string,
  paramNames: readonly string[],
  options: KeyTemplateOptions = { headMatchesGet: true },
): KeyTemplate {
  const parts: Part[] = [];
  const headers: string[] = [];
  let rest = source;
  while (rest.length > 0) {
    const open = rest.indexOf('{');
    const close = rest.indexOf('}');
    if (open === -1) {
      if (close !== -1) throw new Error(`"${source}": unmatched "}"`);
      parts.push(rest);
      break;
    }
    if (close !== -1 && close < open) throw new Error(`"${source}": unmatched "}"`);
    if (open > 0) parts.push(rest.slice(0, open));
    const end = rest.indexOf('}', open);
    if (end === -1) throw new Error(`"${source}": unmatched "{"`);
    parts.push(placeholder(rest.slice(open + 1, end), source, paramNames, headers, options));
    rest = rest.slice(end + 1);
  }
  if (parts.length === 0) throw new Error('key template is empty');
  const literal = parts.every((part) => typeof part === 'string');
  const constant = literal ? parts.join('') : undefined;
  if (constant !== undefined && Buffer.byteLength(constant) > MAX_KEY_BYTES) {
    throw new Error(`"${source}": a key of ${Buffer.byteLength(constant)} bytes; at most ${MAX_KEY_BYTES}`);
  }
  const head = typeof parts[0] === 'string' ? parts[0].slice(0, FOLDED_HEAD_LENGTH) : '';
  const shape = new RegExp(
    `^(?:${parts.map((part) => (typeof part === 'string' ? escapeRegExp(part) : '.+?')).join('')}|${escapeRegExp(head)}~h\\.[0-9a-f]{32})$`,
    's',
  );
  return {
    source,
    constant,
    headers,
    matches: (key) => (constant !== undefined ? key === constant : shape.test(key)),
    render(context) {
      if (constant !== undefined) return constant;
      let key = '';
      for (const part of parts) key += typeof part === 'string' ? part : part(context);
      // Under a third of the bound in UTF-16 units cannot be over it in UTF-8 bytes.
      if (key.length <= MAX_KEY_BYTES / 3 || Buffer.byteLength(key) <= MAX_KEY_BYTES) return key;
      return `${head}~h.${createHash('sha256').update(key).digest('hex').slice(0, 32)}`;
    },
  };
}

function placeholder(
  body: string,
  source: string,
  paramNames: readonly string[],
  headers: string[],
  options: KeyTemplateOptions,
): Part {
  const colon = body.indexOf(':');
  const kind = colon === -1 ? body : body.slice(0, colon);
  const argument = colon === -1 ? '' : body.slice(colon + 1);
  const needsArgument = kind === 'param' || kind === 'header' || kind === 'headerHash';
  if (needsArgument === (argument === '')) {
    throw new Error(
      `"${source}": bad placeholder {${body}} (use {client}, {method}, {route}, {param:name}, {header:name} or {headerHash:name})`,
    );
  }
  switch (kind) {
    case 'client':
      return (context) => safeValue(context.client);
    case 'method':
      return options.headMatchesGet
        ? (context) => safeValue(context.method === 'HEAD' ? 'GET' : context.method)
        : (context) => safeValue(context.method);
    case 'route':
      return (context) => context.route;
    case 'param':
      if (!paramNames.includes(argument)) {
        throw new Error(`"${source}": {param:${argument}} is not a parameter of the bucket's path pattern`);
      }
      return (context) => safeValue(context.params[argument]);
    case 'header':
    case 'headerHash': {
      if (!HEADER_NAME.test(argument)) throw new Error(`"${source}": "${argument}" is not a header name`);
      const name = argument.toLowerCase();
      headers.push(name);
      return kind === 'header'
        ? (context) => safeValue(context.header(name))
        : (context) => {
            const value = context.header(name);
            return value === undefined ? MISSING : hashPrefix(value);
          };
    }
    default:
      throw new Error(
        `"${source}": unknown placeholder {${body}} (use {client}, {method}, {route}, {param:name}, {header:name} or {headerHash:name})`,
      );
  }
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

function safeValue(value: string | undefined): string {
  if (value === undefined || value === '') return MISSING;
  if (value.length <= MAX_VALUE_LENGTH && SAFE_VALUE.test(value)) return value;
  return `h.${hashPrefix(value)}`;
}

/**
 * What `{headerHash:…}` renders for a header value: the first 16 hex digits of its SHA-256. An
 * operator who overrides one caller's limit in the limits file names the instance this way
 * (`overrides: { "822b33ad87c148a0": 1000 }` for `x-api-key: acme`; `spillway header-hash`).
 */
export function headerHash(value: string): string {
  return hashPrefix(value);
}

function hashPrefix(value: string): string {
  return createHash('sha256').update(value).digest('hex').slice(0, 16);
}
