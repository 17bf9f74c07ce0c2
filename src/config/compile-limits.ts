import { ErrorCode, SpillwayError } from '../core/errors.js';
import { checkLimitsConfig, formatConfigPath, type LimitsConfig } from './limits-config.js';

/** What a bucket key resolves to under the current limits. */
export interface ResolvedBucket {
  /** The bucket key itself (`api:caller=acme`). */
  key: string;
  limitRps: number;
  mode: 'enforce' | 'shadow';
  scope: 'global' | 'zone';
  /** The rule that matched: its key, or its template (`api:caller=*`). */
  rule: string;
  /** Set for template instances: the text the `*` matched (`acme`). */
  instance?: string;
  /** Template instances only: the template's instance cap. */
  maxInstances?: number;
}

interface CompiledTemplate {
  template: string;
  prefix: string;
  suffix: string;
  limitRps: number;
  mode: 'enforce' | 'shadow';
  scope: 'global' | 'zone';
  overrides: ReadonlyMap<string, number>;
  maxInstances: number;
}

/** Limits ready for lookups: exact keys in a map, templates ordered most specific first. */
export interface CompiledLimits {
  readonly config: LimitsConfig;
  readonly exact: ReadonlyMap<string, ResolvedBucket>;
  readonly templates: readonly CompiledTemplate[];
}

/**
 * Validate (same rules as the file) and index a config. Throws ERR_SPILLWAY_INVALID_CONFIG with the
 * offending path for configs built in code.
 */
export function compileLimits(config: LimitsConfig): CompiledLimits {
  const result = checkLimitsConfig(config);
  if ('issue' in result) {
    const path = formatConfigPath(result.issue.path);
    const label = result.issue.label ?? path;
    throw new SpillwayError(ErrorCode.InvalidConfig, `${label}: ${result.issue.message}`, { path });
  }
  const checked = result.config;
  const exact = new Map<string, ResolvedBucket>();
  const templates: CompiledTemplate[] = [];
  for (const rule of checked.buckets) {
    if (rule.key !== undefined) {
      exact.set(rule.key, {
        key: rule.key,
        limitRps: rule.limitRps,
        mode: rule.mode,
        scope: rule.scope,
        rule: rule.key,
      });
    } else if (rule.template !== undefined) {
      const star = rule.template.indexOf('*');
      templates.push({
        template: rule.template,
        prefix: rule.template.slice(0, star),
        suffix: rule.template.slice(star + 1),
        limitRps: rule.limitRps,
        mode: rule.mode,
        scope: rule.scope,
        overrides: new Map(Object.entries(rule.overrides ?? {})),
        maxInstances: rule.maxInstances ?? 0,
      });
    }
  }
  // Most literal characters first, so `api:caller=*` wins over `api:*` for `api:caller=acme`;
  // ties keep file order (sort is stable).
  templates.sort((a, b) => b.prefix.length + b.suffix.length - (a.prefix.length + a.suffix.length));
  return { config: checked, exact, templates };
}

/**
 * Resolve a bucket key: an exact rule first, then the most specific matching template (its
 * override for the matched text if any, else its default limit). `undefined` when no rule matches.
 * Allocates only for template instances.
 */
export function matchBucket(limits: CompiledLimits, key: string): ResolvedBucket | undefined {
  const exact = limits.exact.get(key);
  if (exact) return exact;
  for (const t of limits.templates) {
    if (
      key.length > t.prefix.length + t.suffix.length &&
      key.startsWith(t.prefix) &&
      key.endsWith(t.suffix)
    ) {
      const instance = key.slice(t.prefix.length, key.length - t.suffix.length);
      return {
        key,
        limitRps: t.overrides.get(instance) ?? t.limitRps,
        mode: t.mode,
        scope: t.scope,
        rule: t.template,
        instance,
        maxInstances: t.maxInstances,
      };
    }
  }
  return undefined;
}
