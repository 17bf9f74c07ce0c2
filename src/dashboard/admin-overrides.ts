import type { BucketRule, LimitsConfig } from '../config/limits-config.js';

/** What an operator changed on one rule from the dashboard; absent fields follow the file. */
export interface RuleOverride {
  mode?: 'enforce' | 'shadow';
  limitRps?: number;
}

/** A rule as the controller enforces it, with where each value came from. */
export interface EffectiveRule {
  /** The rule's key or template: how admin actions name it. */
  rule: string;
  kind: 'key' | 'template';
  mode: 'enforce' | 'shadow';
  limitRps: number;
  scope: 'global' | 'zone';
  /** The file's values, when an override replaces them. */
  file: { mode: 'enforce' | 'shadow'; limitRps: number };
  override: RuleOverride | undefined;
  /** When the override was set (epoch ms). */
  overriddenAtMs: number | undefined;
}

export interface AdminOverrides {
  /** The limits file as last loaded (without overrides). */
  readonly fileConfig: LimitsConfig;
  /** The file with every override applied: what the controller runs. */
  effective(): LimitsConfig;
  rules(): EffectiveRule[];
  /** The rule as enforced now, or undefined when no rule has that key or template. */
  rule(name: string): EffectiveRule | undefined;
  /** Merges `patch` into the rule's override. The caller checked that the rule exists. */
  set(name: string, patch: RuleOverride, atMs: number): void;
  /** Drops the rule's override (the file's values apply again). Returns whether one existed. */
  clear(name: string): boolean;
  /**
   * A new limits file: overrides stay on top of it, except those whose rule the file no longer has
   * (returned, so the caller can log them) and fields the file now agrees with.
   */
  replaceFile(config: LimitsConfig): { dropped: string[] };
}

/**
 * Operator changes made from the dashboard, kept in memory on top of the limits file. The file stays
 * the source of truth an operator edits and reviews; an override is a deliberate, visible,
 * temporary deviation from it (shown as such on the page and in /api/snapshot) that survives file
 * reloads and ends when cleared or when the controller restarts. Writing changes back into the file
 * would rewrite a human-maintained YAML document (comments, anchors, order) from a web page.
 */
export function createAdminOverrides(initial: LimitsConfig): AdminOverrides {
  let fileConfig = initial;
  const overrides = new Map<string, { override: RuleOverride; atMs: number }>();

  const ruleName = (rule: BucketRule): string => rule.key ?? rule.template ?? '';

  function apply(rule: BucketRule): BucketRule {
    const entry = overrides.get(ruleName(rule));
    if (!entry) return rule;
    return {
      ...rule,
      ...(entry.override.mode !== undefined ? { mode: entry.override.mode } : {}),
      ...(entry.override.limitRps !== undefined ? { limitRps: entry.override.limitRps } : {}),
    };
  }

  function describe(rule: BucketRule): EffectiveRule {
    const name = ruleName(rule);
    const entry = overrides.get(name);
    const applied = apply(rule);
    return {
      rule: name,
      kind: rule.key !== undefined ? 'key' : 'template',
      mode: applied.mode,
      limitRps: applied.limitRps,
      scope: rule.scope,
      file: { mode: rule.mode, limitRps: rule.limitRps },
      override: entry ? { ...entry.override } : undefined,
      overriddenAtMs: entry?.atMs,
    };
  }

  /** Fields equal to the file's are not overrides: the page must not show a deviation that is none. */
  function prune(name: string): void {
    const entry = overrides.get(name);
    const rule = fileConfig.buckets.find((r) => ruleName(r) === name);
    if (!entry || !rule) return;
    if (entry.override.mode === rule.mode) delete entry.override.mode;
    if (entry.override.limitRps === rule.limitRps) delete entry.override.limitRps;
    if (entry.override.mode === undefined && entry.override.limitRps === undefined) overrides.delete(name);
  }

  return {
    get fileConfig() {
      return fileConfig;
    },
    effective() {
      return { ...fileConfig, buckets: fileConfig.buckets.map(apply) };
    },
    rules() {
      return fileConfig.buckets.map(describe);
    },
    rule(name) {
      const rule = fileConfig.buckets.find((r) => ruleName(r) === name);
      return rule ? describe(rule) : undefined;
    },
    set(name, patch, atMs) {
      const entry = overrides.get(name) ?? { override: {}, atMs };
      entry.override = { ...entry.override, ...patch };
      entry.atMs = atMs;
      overrides.set(name, entry);
      prune(name);
    },
    clear(name) {
      return overrides.delete(name);
    },
    replaceFile(config) {
      fileConfig = config;
      const names = new Set(config.buckets.map(ruleName));
      const dropped: string[] = [];
      for (const name of [...overrides.keys()]) {
        if (names.has(name)) prune(name);
        else {
          overrides.delete(name);
          dropped.push(name);
        }
      }
      return { dropped };
    },
  };
}
