import { assertKnownOptions, optionNames } from '../../core/validate.js';
import type { ProxyBackendOptions } from './proxy-backend.js';
import type { ProxyServerOptions } from './proxy-server.js';

/**
 * The option names `startProxyServer` and `createProxyBackend` know: a typo is an error that names
 * it (with a suggestion), never an option silently left at its default.
 */
const PROXY_SERVER_OPTIONS = optionNames<ProxyServerOptions>({
  rules: true,
  backend: true,
  host: true,
  port: true,
  metrics: true,
  logger: true,
});

const PROXY_BACKEND_OPTIONS = optionNames<ProxyBackendOptions>({
  id: true,
  logger: true,
  controlClients: true,
  global: true,
});

/** Throws ERR_SPILLWAY_INVALID_OPTION for an option `startProxyServer` does not know. */
export function assertProxyServerOptionNames(options: unknown): void {
  assertKnownOptions(options, PROXY_SERVER_OPTIONS, 'startProxyServer');
}

/** Throws ERR_SPILLWAY_INVALID_OPTION for an option `createProxyBackend` does not know. */
export function assertProxyBackendOptionNames(options: unknown): void {
  assertKnownOptions(options, PROXY_BACKEND_OPTIONS, 'createProxyBackend');
}
