import { hostname } from 'node:os';
import { createController } from '../control/controller.js';
import { createAutoTuner } from '../control/tuning/auto-tuner.js';
import type { HistoryStore } from '../control/tuning/history-store.js';
import { createPeakRecorder, type PeakRecorder } from '../control/tuning/peak-recorder.js';
import { createSqliteHistoryStore } from '../control/tuning/sqlite-history-store.js';
import { createTuningSuggestions } from '../control/tuning/tuning-suggestions.js';
import { systemScheduler } from '../core/clock.js';
import { createAdminActions } from '../dashboard/admin-actions.js';
import { createAdminOverrides } from '../dashboard/admin-overrides.js';
import { MIN_ADMIN_TOKEN_LENGTH } from '../dashboard/admin-token.js';
import { type DashboardServer, startDashboardServer } from '../dashboard/dashboard-server.js';
import { observeTimers } from '../dashboard/tick-observer.js';
import { addControllerMetrics } from '../ops/controller-metrics.js';
import { logListening } from '../ops/logger.js';
import { createMetrics } from '../ops/metrics.js';
import { startOpsServer } from '../ops/ops-server.js';
import { createReloadMetrics } from '../ops/reload-metrics.js';
import { allowedHostsFromFlag, OPS_ALLOWED_HOST_FLAGS, opsEndpointFromFlags } from './allowed-host-flags.js';
import { BUCKET_SERIES_FLAGS, maxBucketSeriesFromFlags } from './bucket-series-flag.js';
import {
  type CommandSpec,
  numberFlag,
  parseHostPort,
  runCommand,
  stringFlag,
  usageError,
} from './command-line.js';
import { ConfigReloader } from './config-reloader.js';
import { LIMITS_FORMAT_FLAG, limitsFormatFromFlags, readLimitsSource } from './limits-source.js';
import { LOG_LEVEL_FLAG, loggerFromFlags } from './log-level-flag.js';
import { shutdownWithin, waitForShutdownOrReload } from './process-lifecycle.js';
import { serveReports } from './report-server.js';
import { REPORTER_CAP_FLAGS, reporterCapFromFlags } from './reporter-cap-flags.js';
import {
  AUTH_TOKEN_FLAGS,
  readAuthToken,
  readServerTls,
  readZoneTokens,
  TLS_CA_FLAG,
  TLS_SERVER_FLAGS,
  ZONE_TOKEN_FLAGS,
} from './transport-security.js';

export const spec: CommandSpec = {
  name: 'controller',
  summary:
    'Run the global rate limiter controller: holds the limits file, computes drop ratios from the ' +
    'offered load reported by aggregators (or hosts) and answers their reports with directives.',
  flags: {
    config: { type: 'string', valueName: 'limits.yaml', description: 'the limits file', required: true },
    ...LIMITS_FORMAT_FLAG,
    listen: {
      type: 'string',
      valueName: 'host:port',
      description: 'gRPC address for Report',
      defaultText: '127.0.0.1:7070',
    },
    ops: {
      type: 'string',
      valueName: 'host:port',
      description: 'address of /healthz and /metrics',
      defaultText: '127.0.0.1:9090',
    },
    ...OPS_ALLOWED_HOST_FLAGS,
    ...BUCKET_SERIES_FLAGS,
    dashboard: {
      type: 'string',
      valueName: 'host:port',
      description: 'serve the live dashboard and its JSON API here (docs/dashboard.md)',
      defaultText: 'off',
    },
    'dashboard-allowed-host': {
      type: 'string',
      multiple: true,
      valueName: 'host',
      description:
        "another name (or IP address) browsers may reach the dashboard by, e.g. a reverse proxy's; " +
        'requests with any other Host header are refused (DNS rebinding, docs/security.md)',
      defaultText: 'the --dashboard host, plus localhost, 127.0.0.1 and [::1] when that is loopback',
    },
    'dashboard-max-streams': {
      type: 'string',
      valueName: 'n',
      description: 'most live dashboard pages (event streams) at once; more are answered 503',
      defaultText: '32',
    },
    'dashboard-max-streams-per-address': {
      type: 'string',
      valueName: 'n',
      description:
        'most live pages from one client address (an IPv6 /64 counts as one), so one client cannot ' +
        "take every stream; more are answered 429. Behind a reverse proxy every viewer has the proxy's " +
        'address: raise it to --dashboard-max-streams there',
      defaultText: '4',
    },
    'admin-token': {
      type: 'string',
      valueName: 'token',
      description: `bearer token for the dashboard's admin actions, at least ${MIN_ADMIN_TOKEN_LENGTH} characters`,
      defaultText: '$SPILLWAY_ADMIN_TOKEN, else admin actions are off',
    },
    history: {
      type: 'string',
      valueName: 'path.sqlite',
      description:
        'record per-bucket per-minute peaks of offered load here, for `spillway tune` (docs/tuning.md)',
      defaultText: 'off',
    },
    'auto-tune': {
      type: 'boolean',
      description:
        'once a day, apply tuning proposals of buckets with `tuning.auto: true` to the limits file',
    },
    id: {
      type: 'string',
      valueName: 'id',
      description: 'responder identity in replies',
      defaultText: 'controller-<hostname>',
    },
    ...LOG_LEVEL_FLAG,
    ...AUTH_TOKEN_FLAGS,
    ...ZONE_TOKEN_FLAGS,
    ...TLS_SERVER_FLAGS,
    ...TLS_CA_FLAG,
    ...REPORTER_CAP_FLAGS,
  },
  notes: [
    'The limits file is reloaded on SIGHUP and when it changes on disk. A file that fails to load',
    'keeps the previous limits in force; the error is logged and counted',
    '(spillway_config_reloads_total{result="error"}).',
    'With --auth-token-file (or SPILLWAY_AUTH_TOKEN) reports without the same token are refused',
    '(UNAUTHENTICATED). With --zone-token-file z1=path a report carrying that token must claim zone z1',
    '(else INVALID_ARGUMENT, ERR_SPILLWAY_INVALID_REPORT); give an aggregator of z1 that file as its',
    '--auth-token-file. Repeat the flag per zone, or within a zone to rotate tokens. The shared token,',
    'if any, stays valid for any zone. Listening beyond loopback: see docs/security.md.',
    'Dashboard admin actions (flip shadow/enforce, change a limit) are kept in memory on top of the',
    'limits file: they survive reloads of the file and end when cleared or when the controller stops.',
    'Prefer SPILLWAY_ADMIN_TOKEN to --admin-token: command lines are visible to other local users.',
  ],
};

export function run(argv: string[]): Promise<number> {
  return runCommand(spec, argv, async (values) => {
    const maxBucketSeries = maxBucketSeriesFromFlags(values);
    const configPath = stringFlag(values, 'config')!;
    const listen = parseHostPort('listen', stringFlag(values, 'listen') ?? '127.0.0.1:7070');
    const ops = opsEndpointFromFlags(values, '127.0.0.1:9090');
    const id = stringFlag(values, 'id') ?? `controller-${hostname()}`;
    const dashboardAt = stringFlag(values, 'dashboard');
    const dashboardAddress = dashboardAt === undefined ? undefined : parseHostPort('dashboard', dashboardAt);
    const dashboardAllowedHosts = allowedHostsFromFlag(values, 'dashboard-allowed-host');
    if (dashboardAllowedHosts.length > 0 && !dashboardAddress) {
      throw usageError('--dashboard-allowed-host needs --dashboard', { flag: 'dashboard-allowed-host' });
    }
    const maxStreams = numberFlag(values, 'dashboard-max-streams', 32, {
      min: 1,
      max: 10_000,
      integer: true,
    });
    const maxStreamsPerAddress = numberFlag(
      values,
      'dashboard-max-streams-per-address',
      Math.min(4, maxStreams),
      {
        min: 1,
        max: maxStreams,
        integer: true,
      },
    );
    for (const flag of ['dashboard-max-streams', 'dashboard-max-streams-per-address']) {
      if (stringFlag(values, flag) !== undefined && !dashboardAddress)
        throw usageError(`--${flag} needs --dashboard`, { flag });
    }
    const adminToken = stringFlag(values, 'admin-token') ?? (process.env.SPILLWAY_ADMIN_TOKEN || undefined);
    if (adminToken !== undefined && adminToken.length < MIN_ADMIN_TOKEN_LENGTH) {
      throw usageError(`the admin token must be at least ${MIN_ADMIN_TOKEN_LENGTH} characters`, {
        flag: 'admin-token',
      });
    }
    // A client sends it as `Authorization: Bearer <token>`: a space or a non-ASCII character could
    // never arrive as it is here, so every admin request would fail.
    if (adminToken !== undefined && !/^[\x21-\x7e]+$/.test(adminToken)) {
      throw usageError('the admin token must be printable ASCII without spaces', { flag: 'admin-token' });
    }
    if (stringFlag(values, 'admin-token') !== undefined && !dashboardAddress) {
      throw usageError('--admin-token needs --dashboard (admin actions are served by the dashboard)', {
        flag: 'admin-token',
      });
    }
    const historyPath = stringFlag(values, 'history');
    const autoTune = values['auto-tune'] === true;
    if (autoTune && historyPath === undefined) {
      throw usageError('--auto-tune needs --history (proposals are computed from the recorded peaks)', {
        flag: 'auto-tune',
      });
    }
    const logger = loggerFromFlags(values, 'controller', id);
    const shutdown = waitForShutdownOrReload(logger);

    const authToken = await readAuthToken(values);
    const zoneTokens = await readZoneTokens(values, authToken);
    // Every host and aggregator holds a tier token: as the admin token it would make each one an admin.
    if (
      adminToken !== undefined &&
      (adminToken === authToken || zoneTokens.some((z) => z.token === adminToken))
    ) {
      throw usageError(
        "the admin token must differ from the tiers' tokens (--auth-token-file, --zone-token-file): any process holding those could act as admin",
        { flag: 'admin-token' },
      );
    }
    const tls = await readServerTls(values, { caIsForClients: true });
    const reporterCap = reporterCapFromFlags(values);
    const configFormat = limitsFormatFromFlags(values);
    const source = await readLimitsSource(configPath, configFormat);
    if (autoTune && source.format === 'envoy-ratelimit') {
      throw usageError('--auto-tune rewrites Spillway limits files, not envoyproxy/ratelimit ones', {
        flag: 'auto-tune',
      });
    }
    const configText = source.text;
    // What the file says, with the dashboard's admin overrides on top: what the controller runs.
    const overrides = createAdminOverrides(source.parse());
    let dashboard: DashboardServer | undefined;
    // Opened before serving: a history file that cannot be opened is a startup error, not a silent gap.
    let history: HistoryStore | undefined;
    let recorder: PeakRecorder | undefined;
    if (historyPath !== undefined) {
      try {
        history = createSqliteHistoryStore({ path: historyPath });
      } catch (error) {
        throw usageError(`--history: ${(error as Error).message}`, { flag: 'history' });
      }
      recorder = createPeakRecorder({
        store: history,
        onError: (error) =>
          logger.warn({ err: String(error), file: historyPath }, 'history: peaks not recorded'),
      });
    }
    const controller = createController({
      id,
      config: overrides.effective(),
      logger,
      ...(reporterCap ? { reporterCap } : {}),
      scheduler: observeTimers(systemScheduler, () => {
        dashboard?.onTick();
        recorder?.observe(controller.snapshot());
      }),
    });
    const metrics = createMetrics({ component: 'controller', id });
    addControllerMetrics(metrics, controller, { maxBucketSeries });
    const reloads = createReloadMetrics(metrics.registry, 'spillway_config');
    /** The source the reloader read last: `apply` parses it (an envoyproxy/ratelimit directory is many files). */
    let latest = source;
    const reloader = new ConfigReloader({
      path: configPath,
      holds: 'limits',
      text: configText,
      logger,
      read: async () => {
        latest = await readLimitsSource(configPath, configFormat);
        return latest.text;
      },
      watchPath: source.watchPath,
      apply: () => {
        const config = latest.parse();
        const { dropped } = overrides.replaceFile(config);
        controller.updateConfig(overrides.effective());
        if (dropped.length > 0)
          logger.warn({ rules: dropped }, 'admin overrides dropped: their rules left the limits file');
        return { buckets: config.buckets.length };
      },
      count: (result) => reloads.reloaded(result),
    });

    const server = await serveReports(controller, {
      host: listen.host,
      port: listen.port,
      authToken,
      zoneTokens,
      ...(tls ? { tls } : {}),
      metrics,
      logger,
    });
    const opsServer = await startOpsServer({
      ...ops,
      registry: metrics.registry,
      health: () => {
        // Counts only: a probe every few seconds must not copy 100,000 buckets.
        const snapshot = controller.snapshot({ maxBuckets: 0, maxChildren: 0 });
        return {
          ok: true,
          epoch: snapshot.epoch,
          version: snapshot.version,
          buckets: snapshot.bucketsTotal,
          children: snapshot.childrenTotal,
          lastReloadError: reloader.lastError ?? null,
          adminOverrides: overrides.rules().filter((r) => r.override !== undefined).length,
        };
      },
    });
    const tuning = history
      ? createTuningSuggestions({ store: history, config: () => overrides.effective() })
      : undefined;
    if (dashboardAddress) {
      dashboard = await startDashboardServer({
        host: dashboardAddress.host,
        port: dashboardAddress.port,
        allowedHosts: dashboardAllowedHosts,
        maxStreamClients: maxStreams,
        maxStreamClientsPerAddress: maxStreamsPerAddress,
        controller,
        overrides,
        admin: createAdminActions({ overrides, controller, logger, ...(tuning ? { tuning } : {}) }),
        ...(tuning ? { tuning } : {}),
        adminToken,
        logger,
      });
    }
    controller.start();
    const autoTuner =
      history && autoTune
        ? createAutoTuner({ store: history, configPath, logger, onApplied: () => reloader.reload('tune') })
        : undefined;
    autoTuner?.start();
    const watcher = reloader.watch();
    logListening(logger, {
      grpc: server.address,
      ops: opsServer.address,
      ...(dashboard ? { dashboard: dashboard.url, admin: adminToken !== undefined } : {}),
      config: configPath,
      epoch: controller.epoch,
      ...(zoneTokens.length > 0 ? { tokenZones: [...new Set(zoneTokens.map((z) => z.zone))] } : {}),
    });

    shutdown.reloadWith(() => reloader.reload('SIGHUP'));
    await shutdown.stopRequested;
    await shutdownWithin(logger, 10_000, async () => {
      watcher.close();
      await server.close();
      controller.stop();
      await autoTuner?.stop();
      recorder?.flush();
      history?.close();
      await reloader.settled();
      await dashboard?.close();
      await opsServer.close();
      logger.info({}, 'stopped');
    });
    return 0;
  });
}
