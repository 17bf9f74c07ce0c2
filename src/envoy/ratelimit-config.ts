import { readdir, readFile, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { z } from 'zod';
import { type LocatedIssue, parseLocatedYaml } from '../config/located-yaml.js';
import { ErrorCode, SpillwayError } from '../core/errors.js';

/**
 * envoyproxy/ratelimit's configuration file, read unchanged: one domain per file, a tree of
 * descriptors, each with an optional `rate_limit`. The grammar and the load-time errors are the
 * reference server's (../shared/envoy-wire-contract.md, section 3); its messages are kept word for
 * word, located as every Spillway file is: `ratelimit.yaml:7:11: descriptors[0].rate_limit.unit:
 * invalid rate limit unit 'fortnight'`.
 *
 * Two differences, both refusals of files the reference would load: a key it knows but in a place
 * where it ignores it (`shadow_mode` inside `rate_limit`) is an unknown field here, and the file is
 * YAML 1.2 (`yes`/`no` are strings, not booleans), as every Spillway file is.
 */

/** Units the reference accepts (case-insensitive), with their length. MONTH is 30 days, YEAR 365. */
export const UNIT_SECONDS = {
  second: 1,
  minute: 60,
  hour: 3_600,
  day: 86_400,
  week: 604_800,
  month: 2_592_000,
  year: 31_536_000,
} as const;

export type RateLimitUnitName = keyof typeof UNIT_SECONDS;

export interface RateLimitSpec {
  /** Absent when `unlimited`. */
  unit?: RateLimitUnitName;
  /** Units per `unit`; 0 refuses everything. */
  requestsPerUnit: number;
  unlimited: boolean;
  /** What `replaces` entries refer to. */
  name?: string;
  replaces: string[];
}

export interface DescriptorSpec {
  key: string;
  /** Absent: any value, each with its own count. May hold `*` (zero or more characters). */
  value?: string;
  rateLimit?: RateLimitSpec;
  shadowMode: boolean;
  quotaMode: boolean;
  detailedMetric: boolean;
  valueToMetric: boolean;
  /** Wildcard values only: every matching value shares one count. */
  shareThreshold: boolean;
  metadata?: Record<string, unknown>;
  descriptors: DescriptorSpec[];
  /** Where it is in its file, for messages (`descriptors[0].descriptors[1]`). */
  path: (string | number)[];
}

export interface RateLimitDomainSpec {
  domain: string;
  descriptors: DescriptorSpec[];
  /** The file it came from. */
  file: string;
}

/** A scalar the reference reads into a string field (yaml.v2 takes a number's or boolean's text). */
const text = z.union([z.string(), z.number(), z.boolean()]).transform(String);

const rateLimitSchema = z.strictObject({
  unit: text.nullish(),
  requests_per_unit: z.number().int().min(0).max(4_294_967_295).nullish(),
  unlimited: z.boolean().nullish(),
  name: text.nullish(),
  replaces: z.array(z.strictObject({ name: text.nullish() })).nullish(),
});

interface RawDescriptor {
  key?: string | null;
  value?: string | null;
  rate_limit?: z.output<typeof rateLimitSchema> | null;
  shadow_mode?: boolean | null;
  quota_mode?: boolean | null;
  detailed_metric?: boolean | null;
  value_to_metric?: boolean | null;
  share_threshold?: boolean | null;
  metadata?: Record<string, unknown> | null;
  descriptors?: RawDescriptor[] | null;
}

const descriptorSchema: z.ZodType<RawDescriptor> = z.strictObject({
  key: text.nullish(),
  value: text.nullish(),
  rate_limit: rateLimitSchema.nullish(),
  shadow_mode: z.boolean().nullish(),
  quota_mode: z.boolean().nullish(),
  detailed_metric: z.boolean().nullish(),
  value_to_metric: z.boolean().nullish(),
  share_threshold: z.boolean().nullish(),
  metadata: z.record(z.string(), z.unknown()).nullish(),
  get descriptors() {
    return z.array(descriptorSchema).nullish();
  },
});

const fileSchema = z.strictObject({
  domain: text.nullish(),
  descriptors: z.array(descriptorSchema).nullish(),
});

/**
 * Parse one envoyproxy/ratelimit YAML file. Throws ERR_SPILLWAY_INVALID_CONFIG,
 * `file:line:col: <path>: <message>`, with the reference server's message for each of its errors.
 */
export function parseRateLimitConfig(textOfFile: string, fileName = '<ratelimit>'): RateLimitDomainSpec {
  return parseLocatedYaml<typeof fileSchema, RateLimitDomainSpec>(textOfFile, fileName, fileSchema, (raw) => {
    const domain = raw.domain ?? '';
    if (domain === '')
      return { issue: { path: ['domain'], message: 'config file cannot have empty domain' } };
    const issue: { found?: LocatedIssue } = {};
    const descriptors = checkDescriptors(raw.descriptors ?? [], ['descriptors'], `${domain}.`, issue);
    if (issue.found) return { issue: issue.found };
    return { value: { domain, descriptors, file: fileName } };
  });
}

function checkDescriptors(
  raws: readonly RawDescriptor[],
  path: (string | number)[],
  parentKey: string,
  issue: { found?: LocatedIssue },
): DescriptorSpec[] {
  const seen = new Set<string>();
  const out: DescriptorSpec[] = [];
  for (const [index, raw] of raws.entries()) {
    const at = [...path, index];
    const fail = (field: string | undefined, message: string): DescriptorSpec[] => {
      issue.found = { path: field === undefined ? at : [...at, field], message };
      return out;
    };
    const key = raw.key ?? '';
    if (key === '') return fail('key', 'descriptor has empty key');
    const value = raw.value ?? '';
    const finalKey = value === '' ? key : `${key}_${value}`;
    const compositeKey = parentKey + finalKey;
    if (seen.has(finalKey)) return fail('key', `duplicate descriptor composite key '${compositeKey}'`);
    seen.add(finalKey);
    let rateLimit: RateLimitSpec | undefined;
    if (raw.rate_limit) {
      const checked = checkRateLimit(raw.rate_limit);
      if (typeof checked === 'object' && 'message' in checked) {
        issue.found = { path: [...at, 'rate_limit', ...checked.field], message: checked.message };
        return out;
      }
      rateLimit = checked;
    }
    const shareThreshold = raw.share_threshold === true;
    if (shareThreshold && !value.includes('*')) {
      return fail(
        'share_threshold',
        `share_threshold can only be used with wildcard values (containing '*'), but found key '${finalKey}'`,
      );
    }
    const children = checkDescriptors(
      raw.descriptors ?? [],
      [...at, 'descriptors'],
      `${compositeKey}.`,
      issue,
    );
    if (issue.found) return out;
    const spec: DescriptorSpec = {
      key,
      rateLimit,
      shadowMode: raw.shadow_mode === true,
      quotaMode: raw.quota_mode === true,
      detailedMetric: raw.detailed_metric === true,
      valueToMetric: raw.value_to_metric === true,
      shareThreshold,
      descriptors: children,
      path: at,
    };
    if (value !== '') spec.value = value;
    if (raw.metadata) spec.metadata = raw.metadata;
    out.push(spec);
  }
  return out;
}

function checkRateLimit(
  raw: z.output<typeof rateLimitSchema>,
): RateLimitSpec | { field: (string | number)[]; message: string } {
  const unitText = raw.unit ?? '';
  const lower = unitText.toLowerCase();
  const unit = Object.hasOwn(UNIT_SECONDS, lower) ? (lower as RateLimitUnitName) : undefined;
  const unlimited = raw.unlimited === true;
  if (unlimited && unit !== undefined) {
    return { field: ['unit'], message: 'should not specify rate limit unit when unlimited' };
  }
  if (!unlimited && unit === undefined) {
    return { field: ['unit'], message: `invalid rate limit unit '${unitText}'` };
  }
  const name = raw.name ?? '';
  const replaces: string[] = [];
  for (const [index, entry] of (raw.replaces ?? []).entries()) {
    const replaced = entry.name ?? '';
    if (replaced === '') {
      return { field: ['replaces', index], message: 'should not have an empty replaces entry' };
    }
    if (replaced === name) {
      return {
        field: ['replaces', index, 'name'],
        message: 'replaces should not contain name of same descriptor',
      };
    }
    replaces.push(replaced);
  }
  const spec: RateLimitSpec = { requestsPerUnit: raw.requests_per_unit ?? 0, unlimited, replaces };
  if (unit !== undefined) spec.unit = unit;
  if (name !== '') spec.name = name;
  return spec;
}

/**
 * Read `path`: one file, or a directory whose `*.yaml` and `*.yml` files are each a domain (the
 * reference server's runtime directory). Returns the domains and a fingerprint of what was read
 * (file names and contents), which tells a reload whether anything changed. Domains must differ
 * across files (`duplicate domain '<d>' in config file`).
 */
export async function loadRateLimitConfig(
  path: string,
): Promise<{ domains: RateLimitDomainSpec[]; fingerprint: string }> {
  const files = await configFiles(path);
  const domains: RateLimitDomainSpec[] = [];
  let fingerprint = '';
  const seen = new Set<string>();
  for (const file of files) {
    const text = await readConfigFile(file);
    fingerprint += `${file}\u0000${text}\u0000`;
    const spec = parseRateLimitConfig(text, file);
    if (seen.has(spec.domain)) {
      throw new SpillwayError(
        ErrorCode.InvalidConfig,
        `${file}: duplicate domain '${spec.domain}' in config file`,
        {
          file,
          domain: spec.domain,
        },
      );
    }
    seen.add(spec.domain);
    domains.push(spec);
  }
  return { domains, fingerprint };
}

async function configFiles(path: string): Promise<string[]> {
  let isDirectory: boolean;
  try {
    isDirectory = (await stat(path)).isDirectory();
  } catch (error) {
    throw unreadable(path, error);
  }
  if (!isDirectory) return [path];
  const names = (await readdir(path))
    .filter((name) => /\.ya?ml$/.test(name) && !basename(name).startsWith('.'))
    .sort();
  if (names.length === 0) {
    throw new SpillwayError(ErrorCode.InvalidConfig, `${path}: no *.yaml files in this directory`, {
      file: path,
    });
  }
  return names.map((name) => join(path, name));
}

async function readConfigFile(file: string): Promise<string> {
  try {
    return await readFile(file, 'utf8');
  } catch (error) {
    throw unreadable(file, error);
  }
}

function unreadable(file: string, error: unknown): SpillwayError {
  return new SpillwayError(
    ErrorCode.InvalidConfig,
    `${file}: cannot read rate limit config: ${(error as Error).message}`,
    { file },
    { cause: error },
  );
}
