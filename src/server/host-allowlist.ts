import { isIP } from 'node:net';
import { ErrorCode, SpillwayError } from '../core/errors.js';

export interface HostAllowlistOptions {
  /** The host the server listens on, as given to `listen` (`127.0.0.1`, `::1`, `0.0.0.0`, a name). */
  listenHost: string;
  /** More names (or IP addresses) clients may use to reach it: a reverse proxy's, a DNS entry's. */
  allowedHosts?: readonly string[];
}

/** Says whether a request's `Host` header names this server. */
export type HostCheck = (hostHeader: string | undefined) => boolean;

const LOOPBACK_NAMES = ['localhost', '127.0.0.1', '[::1]'];
const WILDCARD_HOSTS = new Set(['0.0.0.0', '[::]']);
/** `name`, `name:port`, `[v6]`, `[v6]:port`: what a browser puts in `Host`. */
const HOST_HEADER = /^(\[[0-9a-f:.]+\]|[^:[\]]+)(?::\d{1,5})?$/i;
const HOST_NAME = /^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$/;

/**
 * The guard against DNS rebinding, for the servers a browser on the machine could reach (the
 * dashboard, the ops endpoint): a page on `evil.example` that re-points its name at 127.0.0.1 can
 * make the operator's browser send it requests the same-origin policy lets it read, but their
 * `Host` still says `evil.example`. Only hosts the server serves are answered:
 *
 * - the listen address, and `allowedHosts`, compared without the port, case-insensitively;
 * - `localhost`, `127.0.0.1` and `[::1]` when it listens on loopback or on every address;
 * - any IP address when it listens on every address (`0.0.0.0`, `::`): it serves each of the
 *   machine's addresses, and a rebinding attack always arrives with a name, never an address.
 *
 * A request without `Host` (HTTP/1.0) is refused: it names nothing served here.
 */
export function createHostCheck(options: HostAllowlistOptions): HostCheck {
  const listen = normalizeHost(options.listenHost);
  const wildcard = WILDCARD_HOSTS.has(listen);
  const allowed = new Set([listen]);
  if (wildcard || isLoopback(listen)) for (const name of LOOPBACK_NAMES) allowed.add(name);
  for (const entry of options.allowedHosts ?? []) {
    const problem = allowedHostProblem(entry);
    if (problem !== undefined) {
      throw new SpillwayError(ErrorCode.InvalidOption, `allowedHosts: ${problem}`, {
        option: 'allowedHosts',
      });
    }
    allowed.add(normalizeHost(entry));
  }
  return (header) => {
    if (header === undefined) return false;
    const match = HOST_HEADER.exec(header.trim());
    if (!match) return false;
    const host = match[1]!.toLowerCase();
    if (allowed.has(host)) return true;
    return wildcard && isIP(host.startsWith('[') ? host.slice(1, -1) : host) !== 0;
  };
}

/** Why `entry` cannot be an allowed host (a reason to show), or undefined when it can. */
export function allowedHostProblem(entry: string): string | undefined {
  const host = normalizeHost(entry);
  if (host.startsWith('[') ? isIP(host.slice(1, -1)) === 6 : isIP(host) === 4 || HOST_NAME.test(host)) {
    return undefined;
  }
  return `'${entry}' is not a host name or IP address (give it without scheme, port or path)`;
}

/** Lower case; an IPv6 address in brackets, as it appears in `Host`. */
function normalizeHost(host: string): string {
  const lower = host.trim().toLowerCase();
  return isIP(lower) === 6 ? `[${lower}]` : lower;
}

function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '[::1]' || (isIP(host) === 4 && host.startsWith('127.'));
}
