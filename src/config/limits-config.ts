import { z } from 'zod';
import {
  describeZodIssue,
  firstIssue,
  formatConfigPath,
  type LocatedIssue,
  parseLocatedYaml,
  type UnknownFieldHints,
} from './located-yaml.js';
import { readConfigFile } from './read-config-file.js';

export { formatConfigPath };

/**
 * The limits file: what the controller enforces. One YAML document, validated by a strict schema
 * (unknown fields are errors, so a typo never silently disables a limit). Errors name the file,
 * line and column of the offending node: `limits.yaml:7:11: buckets[1].mode: ...`.
 */

/** A per-bucket limit: either one exact key or a template such as `api:caller=*` (one instance per caller). */
export interface BucketRule {
  /** Exact bucket key, e.g. `payments:charge`. Exactly one of `key` and `template` is set. */
  key?: string;
  /** A key pattern with exactly one `*`, which matches one or more characters: `api:caller=*`. */
  template?: string;
  /** Units per second admitted over all hosts (per zone with `scope: zone`). 0 drops everything. */
  limitRps: number;
  /** `enforce` drops; `shadow` only counts would-drops. */
  mode: 'enforce' | 'shadow';
  /** `global`: one limit for the whole fleet; `zone`: the limit applies in each zone separately. */
  scope: 'global' | 'zone';
  /** Templates only: per-instance limits keyed by the text the `*` matched (`acme` for `api:caller=acme`). */
  overrides?: Record<string, number>;
  /** Templates only: most instances tracked at once (bounds memory under many distinct callers). */
  maxInstances?: number;
  /** Exact keys only: how `spillway tune` proposes this bucket's limit (docs/tuning.md). */
  tuning?: BucketTuning;
}

/**
 * Per-bucket tuning settings. Absent fields take the tuner's defaults (src/control/tuning/), so the
 * file keeps only what an operator chose.
 */
export interface BucketTuning {
  /** Apply proposals without review (the controller with --auto-tune, or `spillway tune --apply`). Default false. */
  auto?: boolean;
  /** Proposed limit = quantile of daily peaks x (1 + headroom). */
  headroom?: number;
  /** Which daily peak to size from: 0.95 takes the peak exceeded on at most 5% of days. */
  quantile?: number;
  floorRps?: number;
  ceilingRps?: number;
  /** Largest change per application, as a fraction of the current limit (0.2 = +-20%). */
  maxChangePerDay?: number;
}

/**
 * How the controller turns offered load into a drop ratio. `plain` is the textbook
 * `(offered - limit) / offered` on the last window; `ewma` smooths offered first; `corrected` adds an
 * integral correction from the admitted-vs-limit error that hosts report. docs/control-plane.md has
 * the measurements that chose the default.
 */
export type RatioPolicySpec =
  | { kind: 'plain' }
  | { kind: 'ewma'; alpha: number }
  | { kind: 'corrected'; gain: number; maxCorrection: number; offeredAlpha?: number };

export interface LimitsConfig {
  version: 1;
  /** How often hosts and aggregators report and the controller recomputes ratios. */
  intervalMs: number;
  /** How long a directive stays fresh at a host (then its stale policy applies). */
  ttlMs: number;
  buckets: BucketRule[];
  /** Absent: the controller's default (see DEFAULT_RATIO_POLICY in src/control/ratio-policy.ts). */
  ratioPolicy?: RatioPolicySpec;
}

export const DEFAULT_INTERVAL_MS = 1000;
/** Four intervals: a host rides out three lost reports before its stale policy starts. */
export const DEFAULT_TTL_INTERVALS = 4;
export const DEFAULT_MAX_INSTANCES = 10_000;
/** Same bound as the wire protocol's bucket keys. */
export const MAX_BUCKET_KEY_BYTES = 256;

const finiteNumber = z.number().refine(Number.isFinite, { message: 'must be a finite number' });

const bucketRuleSchema = z.strictObject({
  key: z.string().min(1).optional(),
  template: z.string().min(1).optional(),
  limitRps: finiteNumber.pipe(z.number().min(0)),
  mode: z.enum(['enforce', 'shadow']).default('enforce'),
  scope: z.enum(['global', 'zone']).default('global'),
  overrides: z.record(z.string().min(1), finiteNumber.pipe(z.number().min(0))).optional(),
  maxInstances: z.number().int().min(1).max(1_000_000).optional(),
  tuning: z
    .strictObject({
      auto: z.boolean().default(false),
      headroom: finiteNumber.pipe(z.number().min(0).max(10)).optional(),
      quantile: finiteNumber.pipe(z.number().gt(0).max(1)).optional(),
      floorRps: finiteNumber.pipe(z.number().min(0)).optional(),
      ceilingRps: finiteNumber.pipe(z.number().gt(0)).optional(),
      maxChangePerDay: finiteNumber.pipe(z.number().gt(0).max(10)).optional(),
    })
    .optional(),
});

const ratioPolicySchema = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('plain') }),
  z.strictObject({ kind: z.literal('ewma'), alpha: z.number().gt(0).max(1) }),
  z.strictObject({
    kind: z.literal('corrected'),
    gain: z.number().gt(0).max(1).default(0.2),
    maxCorrection: z.number().gt(0).max(1).default(0.5),
    offeredAlpha: z.number().gt(0).max(1).optional(),
  }),
]);

const limitsSchema = z.strictObject({
  version: z.literal(1),
  intervalMs: z.number().int().min(100).max(60_000).default(DEFAULT_INTERVAL_MS),
  ttlMs: z.number().int().min(100).max(600_000).optional(),
  buckets: z.array(bucketRuleSchema),
  ratioPolicy: ratioPolicySchema.optional(),
});

/**
 * Fields of the proxy's rules file (and other limiters) that a reader may carry over into the limits
 * file, which has no window: every limit is a rate.
 */
const PROXY_FIELD_HINT =
  "the limits file has no window: write limitRps, units per second (a proxy rule's limit / windowSec)";
const LIMITS_FIELD_HINTS: UnknownFieldHints = {
  limit: PROXY_FIELD_HINT,
  windowSec: PROXY_FIELD_HINT,
  windowMs: PROXY_FIELD_HINT,
  window: PROXY_FIELD_HINT,
  name: 'a bucket is named by "key" (one bucket) or "template" (one per value of its "*")',
};

/** One problem found in a config, located by its path in the document. */
export type ConfigIssue = LocatedIssue;

/**
 * Validate a config object (from YAML or built in code): the schema first, then rules the schema
 * cannot express. Returns the defaulted config or the first issue found.
 */
export function checkLimitsConfig(input: unknown): { config: LimitsConfig } | { issue: ConfigIssue } {
  const parsed = limitsSchema.safeParse(input);
  if (!parsed.success) {
    return {
      issue: describeZodIssue(firstIssue(parsed.error.issues), input, limitsSchema, LIMITS_FIELD_HINTS),
    };
  }
  return checkParsedLimits(parsed.data);
}

/** The rules the schema cannot express (ttl vs interval, duplicate and ill-formed rules). */
function checkParsedLimits(
  raw: z.output<typeof limitsSchema>,
): { config: LimitsConfig } | { issue: ConfigIssue } {
  const intervalMs = raw.intervalMs;
  const ttlMs = raw.ttlMs ?? intervalMs * DEFAULT_TTL_INTERVALS;
  if (ttlMs < intervalMs) {
    return {
      issue: { path: ['ttlMs'], message: `must be at least intervalMs (${intervalMs}), got ${ttlMs}` },
    };
  }
  const seen = new Map<string, number>();
  const buckets: BucketRule[] = [];
  for (const [index, rule] of raw.buckets.entries()) {
    const issue = checkRule(rule, index, seen);
    if (issue) return { issue };
    const out: BucketRule = { limitRps: rule.limitRps, mode: rule.mode, scope: rule.scope };
    if (rule.key !== undefined) out.key = rule.key;
    if (rule.template !== undefined) {
      out.template = rule.template;
      out.overrides = { ...(rule.overrides ?? {}) };
      out.maxInstances = rule.maxInstances ?? DEFAULT_MAX_INSTANCES;
    }
    if (rule.tuning !== undefined) out.tuning = { ...rule.tuning };
    buckets.push(out);
  }
  const config: LimitsConfig = { version: 1, intervalMs, ttlMs, buckets };
  if (raw.ratioPolicy) config.ratioPolicy = raw.ratioPolicy;
  return { config };
}

function checkRule(
  rule: z.infer<typeof bucketRuleSchema>,
  index: number,
  seen: Map<string, number>,
): ConfigIssue | undefined {
  const at = (field: string | undefined, message: string): ConfigIssue => ({
    path: field === undefined ? ['buckets', index] : ['buckets', index, field],
    message,
  });
  if ((rule.key === undefined) === (rule.template === undefined)) {
    return at(undefined, 'needs exactly one of "key" or "template"');
  }
  if (rule.key !== undefined) {
    if (rule.key.includes('*')) return at('key', `"${rule.key}" contains "*"; use "template" for patterns`);
    if (Buffer.byteLength(rule.key) > MAX_BUCKET_KEY_BYTES) {
      return at('key', `is longer than ${MAX_BUCKET_KEY_BYTES} bytes`);
    }
    if (rule.overrides !== undefined) return at('overrides', 'is only allowed on a template rule');
    if (rule.maxInstances !== undefined) return at('maxInstances', 'is only allowed on a template rule');
  }
  const tuning = rule.tuning;
  if (tuning !== undefined) {
    if (rule.template !== undefined) return at('tuning', 'is only allowed on a key rule');
    if (
      tuning.floorRps !== undefined &&
      tuning.ceilingRps !== undefined &&
      tuning.floorRps > tuning.ceilingRps
    ) {
      return {
        path: ['buckets', index, 'tuning', 'floorRps'],
        message: `must be at most ceilingRps (${tuning.ceilingRps}), got ${tuning.floorRps}`,
      };
    }
  }
  if (rule.template !== undefined) {
    const stars = rule.template.split('*').length - 1;
    if (stars !== 1) {
      return at('template', `"${rule.template}" must contain exactly one "*", found ${stars}`);
    }
    if (Buffer.byteLength(rule.template) > MAX_BUCKET_KEY_BYTES) {
      return at('template', `is longer than ${MAX_BUCKET_KEY_BYTES} bytes`);
    }
  }
  const identity = rule.key !== undefined ? `key "${rule.key}"` : `template "${rule.template}"`;
  const previous = seen.get(identity);
  if (previous !== undefined) {
    return at(
      rule.key !== undefined ? 'key' : 'template',
      `duplicate rule for ${identity} (first at buckets[${previous}])`,
    );
  }
  seen.set(identity, index);
  return undefined;
}

/**
 * Parse and validate a limits file. Throws SpillwayError ERR_SPILLWAY_INVALID_CONFIG with message
 * `file:line:col: <path>: <what>` and details `{ file, line, column, path }` (line and column 1-based).
 */
export function parseLimitsConfig(text: string, fileName = '<limits>'): LimitsConfig {
  return parseLocatedYaml(
    text,
    fileName,
    limitsSchema,
    (raw) => {
      const checked = checkParsedLimits(raw);
      return 'config' in checked ? { value: checked.config } : checked;
    },
    LIMITS_FIELD_HINTS,
  );
}

/** Read and parse a limits file. File-system failures become ERR_SPILLWAY_INVALID_CONFIG too. */
export async function loadLimitsConfig(path: string): Promise<LimitsConfig> {
  return parseLimitsConfig(await readConfigFile(path, { kind: 'limits file' }), path);
}
