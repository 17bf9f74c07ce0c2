// `spillway/dashboard`: the controller's web page and admin API, for embedding a controller in code.
export type {
  AdminActionName,
  AdminActionResult,
  AdminActions,
  AdminActionsOptions,
  AdminActor,
  RuleValues,
} from './admin-actions.js';
export { createAdminActions } from './admin-actions.js';
export type { AdminOverrides, EffectiveRule, RuleOverride } from './admin-overrides.js';
export { createAdminOverrides } from './admin-overrides.js';
export { checkBearer, MIN_ADMIN_TOKEN_LENGTH, tokensEqual } from './admin-token.js';
export { ApiError, ApiErrorCode } from './api-error.js';
export type { BucketHistoryColumns, BucketSeries } from './bucket-history.js';
export type { DashboardServer, DashboardServerOptions } from './dashboard-server.js';
export { startDashboardServer } from './dashboard-server.js';
export type {
  ChildFreshness,
  DashboardBucket,
  DashboardChild,
  DashboardView,
  ViewLimits,
} from './dashboard-view.js';
export { buildDashboardView } from './dashboard-view.js';
export { observeTimers } from './tick-observer.js';
export type { TuningSource, TuningSuggestion } from './tuning-source.js';
