import { hostname } from 'node:os';
import { type ChildTier, createAggregator } from '../control/aggregator.js';
import { addAggregatorMetrics } from '../ops/aggregator-metrics.js';
import { logListening } from '../ops/logger.js';
import { createMetrics } from '../ops/metrics.js';
import { startOpsServer } from '../ops/ops-server.js';
import { OPS_ALLOWED_HOST_FLAGS, opsEndpointFromFlags } from './allowed-host-flags.js';
import { BUCKET_SERIES_FLAGS, maxBucketSeriesFromFlags } from './bucket-series-flag.js';
import {
  type CommandSpec,
  listFlag,
  numberFlag,
  parseHostPort,
  parseTargets,
  runCommand,
  stringFlag,
  usageError,
} from './command-line.js';
import { LOG_LEVEL_FLAG, loggerFromFlags } from './log-level-flag.js';
import { createParentClients } from './parent-clients.js';
import { shutdownWithin, waitForShutdown } from './process-lifecycle.js';
import { serveReports } from './report-server.js';
import { REPORTER_CAP_FLAGS, reporterCapFromFlags } from './reporter-cap-flags.js';
import {
  AUTH_TOKEN_FLAGS,
  readAuthToken,
  readChildToken,
  readClientTls,
  readServerTls,
  TLS_CLIENT_FLAGS,
  TLS_SERVER_FLAGS,
} from './transport-security.js';

export const spec: CommandSpec = {
  name: 'aggregator',
  summary:
    "Run a zone aggregator: sums its hosts' reports into the zone's usage, forwards it to a parent " +
    '(controller or regional aggregator) every interval and relays the directives back down.',
  flags: {
    zone: {
      type: 'string',
      valueName: 'zone',
      description: 'zone this aggregator speaks for',
      required: true,
    },
    parent: {
      type: 'string',
      multiple: true,
      valueName: 'host:port[,host:port...]',
      description: 'controller(s) or upper aggregator(s), in failover order (or all at once: --parent-mode)',
      required: true,
    },
    'parent-mode': {
      type: 'string',
      valueName: 'failover|fanout',
      description:
        'failover: each forward goes to the first healthy parent; fanout: to every parent (controller replicas)',
      defaultText: 'failover',
    },
    'accept-zone': {
      type: 'string',
      multiple: true,
      valueName: 'zone[,zone...]',
      description:
        "zones whose reports are accepted ('*': any, for a regional aggregator); others are refused",
      defaultText: 'the --zone',
    },
    'child-tier': {
      type: 'string',
      multiple: true,
      valueName: 'host|aggregator',
      description:
        "tiers whose reports are accepted ('aggregator' for a regional aggregator over zone aggregators); others are refused",
      defaultText: 'host',
    },
    'child-token-file': {
      type: 'string',
      valueName: 'path',
      description:
        'file holding the token required from children (first line), when it differs from the one sent to parents: hosts then cannot report to the parents',
      defaultText: 'the --auth-token-file token',
    },
    region: { type: 'string', valueName: 'region', description: 'region put in forwarded reports' },
    listen: {
      type: 'string',
      valueName: 'host:port',
      description: 'gRPC address for Report',
      defaultText: '127.0.0.1:7071',
    },
    ops: {
      type: 'string',
      valueName: 'host:port',
      description: 'address of /healthz and /metrics',
      defaultText: '127.0.0.1:9091',
    },
    ...OPS_ALLOWED_HOST_FLAGS,
    ...BUCKET_SERIES_FLAGS,
    id: {
      type: 'string',
      valueName: 'id',
      description: 'identity up and down',
      defaultText:
        'aggregator-<zone>-<hostname>-<listen port> (the pid instead of the port with --listen :0)',
    },
    'interval-ms': {
      type: 'string',
      valueName: 'ms',
      description: "forward interval until a parent's reply sets one",
      defaultText: '1000',
    },
    'report-timeout-ms': {
      type: 'string',
      valueName: 'ms',
      description: 'per-forward deadline',
      defaultText: 'half the interval',
    },
    ...LOG_LEVEL_FLAG,
    ...AUTH_TOKEN_FLAGS,
    ...TLS_SERVER_FLAGS,
    ...TLS_CLIENT_FLAGS,
    ...REPORTER_CAP_FLAGS,
  },
  notes: [
    'With --auth-token-file (or SPILLWAY_AUTH_TOKEN) the token is required from hosts and sent to parents.',
    'Listening beyond loopback: see docs/security.md.',
    'Example: spillway aggregator --zone z1 --parent 127.0.0.1:7070 --listen 127.0.0.1:7071 --ops 127.0.0.1:9091',
  ],
};

export function run(argv: string[]): Promise<number> {
  return runCommand(spec, argv, async (values) => {
    const maxBucketSeries = maxBucketSeriesFromFlags(values);
    const zone = stringFlag(values, 'zone')!;
    const parents = parseTargets('parent', listFlag(values, 'parent'));
    const listen = parseHostPort('listen', stringFlag(values, 'listen') ?? '127.0.0.1:7071');
    const ops = opsEndpointFromFlags(values, '127.0.0.1:9091');
    const id = stringFlag(values, 'id') ?? defaultAggregatorId(zone, listen.port);
    const intervalMs = numberFlag(values, 'interval-ms', 1000, { min: 100 });
    const reportTimeoutMs = stringFlag(values, 'report-timeout-ms')
      ? numberFlag(values, 'report-timeout-ms', 0, { min: 1 })
      : undefined;
    const logger = loggerFromFlags(values, 'aggregator', id);
    const authToken = await readAuthToken(values);
    const serverTls = await readServerTls(values);
    const clientTls = await readClientTls(values);
    const reporterCap = reporterCapFromFlags(values);
    const parentMode = stringFlag(values, 'parent-mode') ?? 'failover';
    if (parentMode !== 'failover' && parentMode !== 'fanout') {
      throw usageError(`--parent-mode must be failover or fanout, got '${parentMode}'`, {
        flag: 'parent-mode',
      });
    }
    const acceptZones = listFlag(values, 'accept-zone');
    const anyZone = acceptZones.includes('*');
    const childTierList = listFlag(values, 'child-tier');
    for (const tier of childTierList) {
      if (tier !== 'host' && tier !== 'aggregator') {
        throw usageError(`--child-tier must be host or aggregator, got '${tier}'`, { flag: 'child-tier' });
      }
    }
    const childTiers = (childTierList.length > 0 ? childTierList : ['host']) as ChildTier[];
    const childToken = await readChildToken(values, authToken);

    const metrics = createMetrics({ component: 'aggregator', id });
    const clients = await createParentClients(parents, {
      authToken,
      tls: clientTls,
      intervalMs,
      metrics,
      logger,
      thread: 'caller',
    });
    const aggregator = createAggregator({
      id,
      zone,
      region: stringFlag(values, 'region'),
      parents: clients,
      parentMode,
      ...(anyZone ? {} : { acceptZones: acceptZones.length > 0 ? acceptZones : [zone] }),
      childTiers,
      ...(reporterCap ? { reporterCap } : {}),
      intervalMs,
      reportTimeoutMs,
      authToken,
      logger,
    });
    addAggregatorMetrics(metrics, aggregator, { maxBucketSeries });
    const server = await serveReports(aggregator, {
      host: listen.host,
      port: listen.port,
      authToken: childToken,
      ...(serverTls ? { tls: serverTls } : {}),
      metrics,
      logger,
    });
    const opsServer = await startOpsServer({
      ...ops,
      registry: metrics.registry,
      // Hosts are answered from the directive cache whether or not a parent answers (fail open), so
      // the process is healthy either way; the details show how the upstream side is doing.
      health: () => {
        const { hosts, parentsHealthy, lastForwardAtMs } = aggregator.health();
        return { ok: true, zone, hosts, parentsHealthy, lastForwardAtMs: lastForwardAtMs ?? null };
      },
    });
    aggregator.start();
    logListening(logger, { grpc: server.address, ops: opsServer.address, zone, parents, parentMode });

    await waitForShutdown(logger);
    await shutdownWithin(logger, 10_000, async () => {
      await server.close();
      await aggregator.stop();
      for (const client of clients) client.close();
      await opsServer.close();
      logger.info({}, 'stopped');
    });
    return 0;
  });
}

/**
 * The same on every restart of one aggregator (host name and listen port; in Kubernetes the pod
 * name), so a restarted aggregator takes back its own entry at its parents instead of needing a
 * second one while the first expires, and its hosts' acknowledgements still name it. Two processes
 * cannot listen on one port, so it stays unique per machine; with port 0 the port is not known yet
 * and not stable anyway, so the process id stands in.
 */
export function defaultAggregatorId(zone: string, listenPort: number): string {
  return `aggregator-${zone}-${hostname()}-${listenPort === 0 ? `pid${process.pid}` : listenPort}`;
}
