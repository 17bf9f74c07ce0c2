import { allowedHostProblem } from '../server/host-allowlist.js';
import {
  type FlagSpec,
  type FlagValues,
  listFlag,
  parseHostPort,
  stringFlag,
  usageError,
} from './command-line.js';

/** The ops endpoint's extra names (controller, aggregator, proxy, host); see server/host-allowlist.ts. */
export const OPS_ALLOWED_HOST_FLAGS: Record<string, FlagSpec> = {
  'ops-allowed-host': {
    type: 'string',
    multiple: true,
    valueName: 'host',
    description:
      'another name (or IP address) scrapers and probes may reach /healthz and /metrics by, e.g. a DNS ' +
      'name Prometheus scrapes; requests with any other Host header are refused (DNS rebinding, docs/security.md)',
    defaultText:
      'the --ops host, plus localhost, 127.0.0.1 and [::1] when that is loopback, and any IP address when it is 0.0.0.0 or ::',
  },
};

/**
 * The names given to a repeatable allowed-host flag (`--ops-allowed-host`,
 * `--dashboard-allowed-host`): a usage error for one that could match no `Host` header (a URL, a
 * port), instead of a server that refuses every request by that name.
 */
export function allowedHostsFromFlag(values: FlagValues, flag: string): string[] {
  const hosts = listFlag(values, flag);
  for (const entry of hosts) {
    const problem = allowedHostProblem(entry);
    if (problem !== undefined) throw usageError(`--${flag}: ${problem}`, { flag });
  }
  return hosts;
}

/** Where the ops endpoint listens and the names it answers to: what `startOpsServer` takes of them. */
export interface OpsEndpoint {
  host: string;
  port: number;
  allowedHosts: string[];
}

/** `--ops` (else `defaultAddress`) and `--ops-allowed-host`, checked in that order. */
export function opsEndpointFromFlags(values: FlagValues, defaultAddress: string): OpsEndpoint {
  const { host, port } = parseHostPort('ops', stringFlag(values, 'ops') ?? defaultAddress);
  return { host, port, allowedHosts: allowedHostsFromFlag(values, 'ops-allowed-host') };
}
