import { createHash } from 'node:crypto';

/**
 * Bucket keys for envoyproxy/ratelimit rules, the same in every `spillway rls` and in the controller
 * that reads the same file, so their reports and its limits meet.
 *
 * A rule's id is its path: the domain, then `.key` or `.key=value` per level (`envoy.remote_address`,
 * `envoy.generic_key=login.user`). A rule whose path pins every value is one bucket, named by its id.
 * A rule with levels that take any value (no `value`, or a wildcard without `share_threshold`)
 * counts each combination apart: its buckets are `<id>#<values>` with the request's values for those
 * levels joined by `|` (`envoy.remote_address#10.0.0.1`), and the controller knows it as the
 * template `<id>#*`.
 *
 * Names are made unambiguous by escaping, in each domain, key and value, the characters the
 * structure uses (`% . = * # | !`) as `%XX`; a template's `*` is then the only one in it, and a key
 * can match one template only. An empty value is `%00`, so an instance is never empty. A key that
 * would pass the protocol's 256 bytes has its values replaced by `%H` and a hash of them.
 */
export const MAX_BUCKET_KEY_BYTES = 256;
/** `#%H` and 24 base64url characters (144 bits of SHA-256). */
const HASHED_INSTANCE_BYTES = 1 + 2 + 24;
/** Longest rule id that can still name its buckets (hashed when values are long). */
export const MAX_TEMPLATE_RULE_ID_BYTES = MAX_BUCKET_KEY_BYTES - HASHED_INSTANCE_BYTES;

// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are escaped on purpose
const RESERVED = /[%.=*#|!\u0000-\u001f\u007f]/g;

export function escapeComponent(text: string): string {
  if (text === '') return '%00';
  return text.replace(RESERVED, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`);
}

/** A level of a rule id: `key` or `key=value`. */
export function ruleLevel(key: string, value: string | undefined): string {
  return value === undefined ? escapeComponent(key) : `${escapeComponent(key)}=${escapeComponent(value)}`;
}

/** The bucket of one instance of a rule with variable levels, from the request's values for them. */
export function instanceKey(ruleId: string, values: readonly string[]): string {
  let instance = '';
  for (let i = 0; i < values.length; i++) {
    instance += i === 0 ? escapeComponent(values[i]!) : `|${escapeComponent(values[i]!)}`;
  }
  const key = `${ruleId}#${instance}`;
  // Length in characters bounds bytes from below; only long keys pay for the exact count.
  if (key.length * 3 <= MAX_BUCKET_KEY_BYTES || Buffer.byteLength(key) <= MAX_BUCKET_KEY_BYTES) return key;
  return `${ruleId}#%H${createHash('sha256').update(instance).digest('base64url').slice(0, 24)}`;
}

/** The controller's template for a rule with variable levels. */
export function templateOf(ruleId: string): string {
  return `${ruleId}#*`;
}

/** A request's own limit (`RateLimitDescriptor.limit`) counts under `<domain>.!override#<entries>`. */
export function overrideRuleId(domain: string): string {
  return `${escapeComponent(domain)}.!override`;
}

/** The bucket of a request-limited descriptor: its entries, as a rule's levels. */
export function overrideKey(domain: string, entries: readonly { key: string; value: string }[]): string {
  const values: string[] = [];
  for (const entry of entries) values.push(`${entry.key}=${entry.value}`);
  return instanceKey(overrideRuleId(domain), values);
}
