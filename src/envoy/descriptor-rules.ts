import { Buffer } from 'node:buffer';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { RateLimitResponse_RateLimit_Unit } from '../gen/envoy/service/ratelimit/v3/rls_pb.js';
import {
  escapeComponent,
  instanceKey,
  MAX_BUCKET_KEY_BYTES,
  MAX_TEMPLATE_RULE_ID_BYTES,
  ruleLevel,
} from './bucket-key.js';
import {
  type DescriptorSpec,
  type RateLimitDomainSpec,
  type RateLimitUnitName,
  UNIT_SECONDS,
} from './ratelimit-config.js';

/** One `rate_limit` of the file, ready to decide with. */
export interface DescriptorRule {
  /** Its path as a bucket key (src/envoy/bucket-key.ts): `envoy.remote_address`. */
  readonly id: string;
  readonly domain: string;
  /** `rate_limit.name`, what other rules' `replaces` refer to. */
  readonly name: string | undefined;
  readonly replaces: readonly string[];
  readonly unlimited: boolean;
  readonly requestsPerUnit: number;
  /** `second` for unlimited rules (never used for them). */
  readonly unit: RateLimitUnitName;
  readonly unitSeconds: number;
  /** What Envoy is told in `current_limit.unit`. */
  readonly responseUnit: RateLimitResponse_RateLimit_Unit;
  /** What the global limiter is given: requests_per_unit / unit seconds. */
  readonly limitRps: number;
  readonly shadowMode: boolean;
  readonly quotaMode: boolean;
  readonly detailedMetric: boolean;
  readonly valueToMetric: boolean;
  /** Levels whose request value is part of the bucket key; 0: the rule is one bucket, `id`. */
  readonly variableLevels: number;
  /** Its place in the file: `ratelimit.yaml: descriptors[0].descriptors[1]`. */
  readonly source: string;
}

export interface RuleNode {
  readonly key: string;
  readonly value: string | undefined;
  /** The value contains `*`. */
  readonly wildcard: boolean;
  /** Wildcard level whose request value is not part of the key (`share_threshold`). */
  readonly shared: boolean;
  readonly rule: DescriptorRule | undefined;
  readonly children: RuleLevel;
}

/** The descriptors of one level: exact `key`+`value` first, then wildcards in file order, then key-only. */
export interface RuleLevel {
  readonly exact: Map<string, RuleNode>;
  readonly wildcards: RuleNode[];
  readonly keyOnly: Map<string, RuleNode>;
}

export interface CompiledDomain {
  readonly domain: string;
  readonly root: RuleLevel;
  readonly rules: readonly DescriptorRule[];
}

/** Every domain's rules, compiled for lookups. */
export interface CompiledRateLimits {
  readonly domains: ReadonlyMap<string, CompiledDomain>;
  readonly rules: readonly DescriptorRule[];
}

/** What a request descriptor resolved to. */
export interface DescriptorMatch {
  rule: DescriptorRule;
  /** The bucket key: `rule.id`, or an instance of it. */
  bucketKey: string;
}

const RESPONSE_UNIT: Record<RateLimitUnitName, RateLimitResponse_RateLimit_Unit> = {
  second: RateLimitResponse_RateLimit_Unit.SECOND,
  minute: RateLimitResponse_RateLimit_Unit.MINUTE,
  hour: RateLimitResponse_RateLimit_Unit.HOUR,
  day: RateLimitResponse_RateLimit_Unit.DAY,
  week: RateLimitResponse_RateLimit_Unit.WEEK,
  month: RateLimitResponse_RateLimit_Unit.MONTH,
  year: RateLimitResponse_RateLimit_Unit.YEAR,
};

/**
 * Index every domain's descriptors. Throws ERR_SPILLWAY_INVALID_CONFIG when a rule's path is too long
 * to name its buckets within the protocol's 256 bytes.
 */
export function compileRateLimits(domains: readonly RateLimitDomainSpec[]): CompiledRateLimits {
  const compiled = new Map<string, CompiledDomain>();
  const all: DescriptorRule[] = [];
  for (const spec of domains) {
    const rules: DescriptorRule[] = [];
    const root = compileLevel(spec, spec.descriptors, escapeComponent(spec.domain), 0, rules);
    compiled.set(spec.domain, { domain: spec.domain, root, rules });
    all.push(...rules);
  }
  return { domains: compiled, rules: all };
}

function compileLevel(
  spec: RateLimitDomainSpec,
  descriptors: readonly DescriptorSpec[],
  parentId: string,
  parentVariables: number,
  rules: DescriptorRule[],
): RuleLevel {
  const level: RuleLevel = { exact: new Map(), wildcards: [], keyOnly: new Map() };
  for (const descriptor of descriptors) {
    const id = `${parentId}.${ruleLevel(descriptor.key, descriptor.value)}`;
    const wildcard = descriptor.value?.includes('*') === true;
    const variable = descriptor.value === undefined || (wildcard && !descriptor.shareThreshold);
    const variables = parentVariables + (variable ? 1 : 0);
    const rule = descriptor.rateLimit ? compileRule(spec, descriptor, id, variables) : undefined;
    if (rule) rules.push(rule);
    const node: RuleNode = {
      key: descriptor.key,
      value: descriptor.value,
      wildcard,
      shared: wildcard && descriptor.shareThreshold,
      rule,
      children: compileLevel(spec, descriptor.descriptors, id, variables, rules),
    };
    if (descriptor.value === undefined) level.keyOnly.set(descriptor.key, node);
    else if (wildcard) level.wildcards.push(node);
    else level.exact.set(exactKey(descriptor.key, descriptor.value), node);
  }
  return level;
}

function compileRule(
  spec: RateLimitDomainSpec,
  descriptor: DescriptorSpec,
  id: string,
  variableLevels: number,
): DescriptorRule {
  const source = `${spec.file}: ${formatPath(descriptor.path)}`;
  const maxBytes = variableLevels > 0 ? MAX_TEMPLATE_RULE_ID_BYTES : MAX_BUCKET_KEY_BYTES;
  if (Buffer.byteLength(id) > maxBytes) {
    throw new SpillwayError(
      ErrorCode.InvalidConfig,
      `${source}: the descriptor path ${id.slice(0, 60)}... is ${Buffer.byteLength(id)} bytes as a bucket key, ` +
        `over the ${maxBytes} the protocol leaves it; shorten its keys or values`,
      { file: spec.file },
    );
  }
  const limit = descriptor.rateLimit!;
  const unit = limit.unit ?? 'second';
  return {
    id,
    domain: spec.domain,
    name: limit.name,
    replaces: limit.replaces,
    unlimited: limit.unlimited,
    requestsPerUnit: limit.requestsPerUnit,
    unit,
    unitSeconds: UNIT_SECONDS[unit],
    responseUnit: RESPONSE_UNIT[unit],
    limitRps: limit.requestsPerUnit / UNIT_SECONDS[unit],
    shadowMode: descriptor.shadowMode,
    quotaMode: descriptor.quotaMode,
    detailedMetric: descriptor.detailedMetric,
    valueToMetric: descriptor.valueToMetric,
    variableLevels,
    source,
  };
}

function exactKey(key: string, value: string): string {
  return `${key}\u0000${value}`;
}

function formatPath(path: readonly (string | number)[]): string {
  return path.map((p, i) => (typeof p === 'number' ? `[${p}]` : i === 0 ? p : `.${p}`)).join('');
}

/**
 * The rule for one request descriptor, as the reference server finds it: level by level, an exact
 * `key`+`value` first, then the first wildcard that matches, then a `key` without value; the
 * `rate_limit` counts only at the level of the descriptor's last entry. `undefined`: no limit.
 */
export function matchDescriptor(
  domain: CompiledDomain,
  entries: readonly { key: string; value: string }[],
): DescriptorMatch | undefined {
  let level = domain.root;
  let values: string[] | undefined;
  for (let i = 0; i < entries.length; i++) {
    const entry = entries[i]!;
    const node = findNode(level, entry.key, entry.value);
    if (node === undefined) return undefined;
    if (node.value === undefined || (node.wildcard && !node.shared)) {
      values ??= [];
      values.push(entry.value);
    }
    if (i === entries.length - 1) {
      const rule = node.rule;
      if (rule === undefined) return undefined;
      return { rule, bucketKey: values === undefined ? rule.id : instanceKey(rule.id, values) };
    }
    level = node.children;
  }
  return undefined;
}

/** Each level's node for a request entry, the same order as `matchDescriptor` (for RLQS bucket ids). */
export function findNode(level: RuleLevel, key: string, value: string): RuleNode | undefined {
  const exact = level.exact.get(exactKey(key, value));
  if (exact !== undefined) return exact;
  for (const node of level.wildcards) {
    if (node.key === key && globMatch(node.value!, value)) return node;
  }
  return level.keyOnly.get(key);
}

/**
 * `*` matches zero or more characters, everything else itself. Linear in practice and never worse
 * than pattern x value (no regular expression: a hostile 64 KiB value must not backtrack).
 */
export function globMatch(pattern: string, value: string): boolean {
  let p = 0;
  let v = 0;
  let starP = -1;
  let starV = 0;
  while (v < value.length) {
    if (p < pattern.length && pattern[p] !== '*' && pattern[p] === value[v]) {
      p++;
      v++;
    } else if (p < pattern.length && pattern[p] === '*') {
      starP = p++;
      starV = v;
    } else if (starP >= 0) {
      p = starP + 1;
      v = ++starV;
    } else {
      return false;
    }
  }
  while (p < pattern.length && pattern[p] === '*') p++;
  return p === pattern.length;
}
