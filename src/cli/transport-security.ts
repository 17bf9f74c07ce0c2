import { readConfigBytes, readConfigFile } from '../config/read-config-file.js';
import type { GrpcClientTlsOptions } from '../transport/grpc-control-client.js';
import {
  type GrpcServerTlsOptions,
  validateZoneTokens,
  type ZoneToken,
} from '../transport/grpc-control-server.js';
import { type FlagSpec, type FlagValues, stringFlag, usageError } from './command-line.js';

/**
 * The flags every control-plane process shares to authenticate its tiers: a shared token (sent in
 * every report, required by receivers) and TLS on the gRPC links, optionally mutual. See
 * docs/security.md for how to combine them.
 */
export const AUTH_TOKEN_FLAGS: Record<string, FlagSpec> = {
  'auth-token-file': {
    type: 'string',
    valueName: 'path',
    description: 'file holding the shared token between tiers (first line; sent up, required from below)',
    defaultText: '$SPILLWAY_AUTH_TOKEN, else no token',
  },
};

/** Inbound (a process that serves Report: controller, aggregator). */
export const TLS_SERVER_FLAGS: Record<string, FlagSpec> = {
  'tls-cert': {
    type: 'string',
    valueName: 'cert.pem',
    description: 'serve Report over TLS with this certificate chain (needs --tls-key)',
  },
  'tls-key': { type: 'string', valueName: 'key.pem', description: 'private key of --tls-cert' },
  'tls-require-client-cert': {
    type: 'boolean',
    description: 'mutual TLS: refuse clients without a certificate signed by --tls-ca',
  },
};

/** Outbound (a process that sends Report: aggregator, host); --tls-ca also verifies clients inbound. */
export const TLS_CLIENT_FLAGS: Record<string, FlagSpec> = {
  'tls-ca': {
    type: 'string',
    valueName: 'ca.pem',
    description: 'CA certificates: report to parents over TLS and verify them (and clients, with mTLS)',
  },
  'tls-client-cert': {
    type: 'string',
    valueName: 'cert.pem',
    description: 'present this certificate to parents (mutual TLS; needs --tls-client-key)',
  },
  'tls-client-key': { type: 'string', valueName: 'key.pem', description: 'private key of --tls-client-cert' },
  'tls-server-name': {
    type: 'string',
    valueName: 'name',
    description: "name to verify in the parents' certificates",
    defaultText: 'the host of each target',
  },
};

/** The controller serves only: its --tls-ca is the client CA for mutual TLS. */
export const TLS_CA_FLAG: Record<string, FlagSpec> = {
  'tls-ca': {
    type: 'string',
    valueName: 'ca.pem',
    description: 'CA certificates that sign client certificates (with --tls-require-client-cert)',
  },
};

async function readPem(values: FlagValues, flag: string): Promise<Buffer | undefined> {
  const path = stringFlag(values, flag);
  if (path === undefined) return undefined;
  return readConfigBytes(path, { flag });
}

/** --auth-token-file (first line, trimmed), else $SPILLWAY_AUTH_TOKEN, else undefined. */
export async function readAuthToken(values: FlagValues): Promise<string | undefined> {
  const path = stringFlag(values, 'auth-token-file');
  if (path === undefined) return process.env.SPILLWAY_AUTH_TOKEN || undefined;
  return readTokenFile('auth-token-file', path);
}

/**
 * The token an aggregator requires from its children: --child-token-file, else the one it sends to
 * its parents. A distinct one keeps the parents' token off the hosts, so a host cannot report to a
 * controller directly (as an aggregator of its own making).
 */
export async function readChildToken(
  values: FlagValues,
  authToken: string | undefined,
): Promise<string | undefined> {
  const path = stringFlag(values, 'child-token-file');
  return path === undefined ? authToken : readTokenFile('child-token-file', path);
}

/** A receiver's tokens bound to zones (the controller): see ZoneToken in grpc-control-server.ts. */
export const ZONE_TOKEN_FLAGS: Record<string, FlagSpec> = {
  'zone-token-file': {
    type: 'string',
    multiple: true,
    valueName: 'zone=path',
    description:
      'a token (first line of path) valid only for reports claiming zone; others with it are refused',
    defaultText: 'none',
  },
};

/**
 * Every --zone-token-file `zone=path` (split at the first `=`), read and checked against each other
 * and the shared token. An empty list when the flag is absent.
 */
export async function readZoneTokens(
  values: FlagValues,
  authToken: string | undefined,
): Promise<ZoneToken[]> {
  const raw = values['zone-token-file'];
  const entries = Array.isArray(raw) ? raw : typeof raw === 'string' ? [raw] : [];
  const zoneTokens: ZoneToken[] = [];
  for (const entry of entries) {
    const separator = entry.indexOf('=');
    const zone = separator < 0 ? '' : entry.slice(0, separator).trim();
    const path = separator < 0 ? '' : entry.slice(separator + 1).trim();
    if (zone === '' || path === '') {
      throw usageError(`--zone-token-file must be zone=path, got '${entry}'`, { flag: 'zone-token-file' });
    }
    zoneTokens.push({ zone, token: await readTokenFile('zone-token-file', path) });
  }
  try {
    validateZoneTokens(zoneTokens, authToken);
  } catch (error) {
    const message = (error as Error).message.replace(/^zoneTokens: /, '');
    throw usageError(`--zone-token-file: ${message}`, { flag: 'zone-token-file' });
  }
  return zoneTokens;
}

/** The first line of a token file, trimmed; a missing file or an empty first line is an error. */
async function readTokenFile(flag: string, path: string): Promise<string> {
  const text = await readConfigFile(path, { flag });
  const token = (text.split(/\r?\n/)[0] ?? '').trim();
  if (token === '') throw usageError(`--${flag}: ${path} holds no token`, { flag });
  return token;
}

/**
 * The serving side's TLS. `caIsForClients`: the process serves only (the controller), so its
 * --tls-ca has no other use than verifying clients, and given without mutual TLS it would be
 * ignored in silence: refused instead. An aggregator's --tls-ca verifies its parents too.
 */
export async function readServerTls(
  values: FlagValues,
  { caIsForClients = false }: { caIsForClients?: boolean } = {},
): Promise<GrpcServerTlsOptions | undefined> {
  const certPem = await readPem(values, 'tls-cert');
  const keyPem = await readPem(values, 'tls-key');
  const caGiven = stringFlag(values, 'tls-ca') !== undefined;
  const requireClientCert = values['tls-require-client-cert'] === true;
  if ((certPem === undefined) !== (keyPem === undefined)) {
    throw usageError('--tls-cert and --tls-key go together', { flag: certPem ? 'tls-key' : 'tls-cert' });
  }
  if (caIsForClients && caGiven && !requireClientCert) {
    throw usageError(
      '--tls-ca names the CAs of client certificates: add --tls-require-client-cert (and --tls-cert, --tls-key), or drop it',
      { flag: 'tls-ca' },
    );
  }
  if (!certPem || !keyPem) {
    if (requireClientCert) throw usageError('--tls-require-client-cert needs --tls-cert and --tls-key');
    return undefined;
  }
  if (!requireClientCert) return { certPem, keyPem, requireClientCert };
  const caPem = await readPem(values, 'tls-ca');
  if (!caPem) throw usageError('--tls-require-client-cert needs --tls-ca');
  return { certPem, keyPem, caPem, requireClientCert };
}

/** Outbound TLS is on when --tls-ca or --tls-client-cert is given. */
export async function readClientTls(values: FlagValues): Promise<GrpcClientTlsOptions | undefined> {
  const caPem = await readPem(values, 'tls-ca');
  const certPem = await readPem(values, 'tls-client-cert');
  const keyPem = await readPem(values, 'tls-client-key');
  const serverNameOverride = stringFlag(values, 'tls-server-name');
  if ((certPem === undefined) !== (keyPem === undefined)) {
    throw usageError('--tls-client-cert and --tls-client-key go together', {
      flag: certPem ? 'tls-client-key' : 'tls-client-cert',
    });
  }
  if (!caPem && !certPem) {
    if (serverNameOverride !== undefined) throw usageError('--tls-server-name needs --tls-ca');
    return undefined;
  }
  return {
    ...(caPem ? { caPem } : {}),
    ...(certPem && keyPem ? { certPem, keyPem } : {}),
    ...(serverNameOverride !== undefined ? { serverNameOverride } : {}),
  };
}
