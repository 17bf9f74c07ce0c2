import type { LimitsConfig } from '../config/limits-config.js';
import type { ControllerSnapshot, ControllerSnapshotOptions } from '../control/controller.js';
import type { Logger } from '../ops/logger.js';
import type { AdminOverrides, RuleOverride } from './admin-overrides.js';
import { ApiError, ApiErrorCode } from './api-error.js';
import type { TuningSource } from './tuning-source.js';

/** Who asked: the name the client gave (`x-spillway-actor`, default `admin`) and its address. */
export interface AdminActor {
  name: string;
  remote: string;
}

export interface RuleValues {
  mode: 'enforce' | 'shadow';
  limitRps: number;
}

export type AdminActionName = 'set-mode' | 'set-limit' | 'clear-override' | 'accept-suggestion';

export interface AdminActionResult {
  action: AdminActionName;
  rule: string;
  before: RuleValues;
  after: RuleValues;
  /**
   * The controller version whose directives first carry the change: its next ratio computation
   * (the next tick, or with a stateless ratio policy the next report of the bucket), so the change
   * is in force at the controller within one interval. Every directive of an earlier version has
   * the old values. Hosts apply it with the reply to their next report after that computation.
   */
  appliesFromVersion: number;
  suggestionId?: string;
}

export interface AdminActions {
  setMode(actor: AdminActor, rule: string, mode: RuleValues['mode']): AdminActionResult;
  setLimit(actor: AdminActor, rule: string, limitRps: number): AdminActionResult;
  clearOverride(actor: AdminActor, rule: string): AdminActionResult;
  acceptSuggestion(actor: AdminActor, id: string): Promise<AdminActionResult>;
}

export interface AdminActionsOptions {
  overrides: AdminOverrides;
  controller: {
    updateConfig(config: LimitsConfig): void;
    snapshot(options?: ControllerSnapshotOptions): ControllerSnapshot;
  };
  /** Audit lines go here at `info` whatever the logger's level (except `silent`). */
  logger: Logger;
  tuning?: TuningSource;
  nowMs?: () => number;
}

/**
 * The operator's changes from the dashboard. Each one becomes an override on top of the limits file
 * (see createAdminOverrides), is applied with `controller.updateConfig` at once (the controller's
 * next tick computes directives with it) and writes one audit line:
 * `{"audit":true,"actor":"...","remote":"...","action":"set-mode","rule":"search","before":{...},"after":{...},"msg":"admin action"}`.
 */
export function createAdminActions(options: AdminActionsOptions): AdminActions {
  const { overrides, controller, tuning } = options;
  const nowMs = options.nowMs ?? Date.now;
  const audit =
    options.logger.level === 'silent' ? options.logger : options.logger.child({}, { level: 'info' });

  function current(rule: string): RuleValues {
    const found = overrides.rule(rule);
    if (!found) {
      throw new ApiError(404, ApiErrorCode.UnknownRule, `no rule has key or template '${rule}'`, { rule });
    }
    return { mode: found.mode, limitRps: found.limitRps };
  }

  /** Applies a change to the overrides and the controller; a config the controller refuses is undone. */
  function change(
    actor: AdminActor,
    action: AdminActionName,
    rule: string,
    edit: () => void,
    extra: Record<string, unknown> = {},
  ): AdminActionResult {
    const before = current(rule);
    const previous = overrides.rule(rule)!;
    edit();
    try {
      controller.updateConfig(overrides.effective());
    } catch (error) {
      overrides.clear(rule);
      if (previous.override) overrides.set(rule, previous.override, previous.overriddenAtMs ?? nowMs());
      throw new ApiError(400, ApiErrorCode.InvalidRequest, (error as Error).message, { rule });
    }
    const after = current(rule);
    const result: AdminActionResult = {
      action,
      rule,
      before,
      after,
      // Counts only: an admin action must not copy every bucket to read one number.
      appliesFromVersion: controller.snapshot({ maxBuckets: 0, maxChildren: 0 }).version + 1,
      ...extra,
    };
    audit.info(
      { audit: true, actor: actor.name, remote: actor.remote, action, rule, before, after, ...extra },
      'admin action',
    );
    return result;
  }

  function patch(rule: string, override: RuleOverride): () => void {
    return () => overrides.set(rule, override, nowMs());
  }

  return {
    setMode(actor, rule, mode) {
      return change(actor, 'set-mode', rule, patch(rule, { mode }));
    },
    setLimit(actor, rule, limitRps) {
      return change(actor, 'set-limit', rule, patch(rule, { limitRps }));
    },
    clearOverride(actor, rule) {
      return change(actor, 'clear-override', rule, () => overrides.clear(rule));
    },
    async acceptSuggestion(actor, id) {
      const list = tuning ? await tuning.suggestions() : [];
      const suggestion = list.find((s) => s.id === id);
      if (!suggestion) {
        throw new ApiError(
          404,
          ApiErrorCode.UnknownSuggestion,
          `no current tuning suggestion has id '${id}'`,
          {
            id,
          },
        );
      }
      const result = change(
        actor,
        'accept-suggestion',
        suggestion.rule,
        patch(suggestion.rule, { limitRps: suggestion.suggestedLimitRps }),
        { suggestionId: id },
      );
      tuning?.accepted?.(id);
      return result;
    },
  };
}
