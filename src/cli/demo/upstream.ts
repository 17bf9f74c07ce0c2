import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../../ops/logger.js';
import { formatHostPort } from '../../protocol/host-port.js';

/**
 * The service the demo's sidecar proxies front: answers every request with a small JSON body at
 * once. It only has to be cheap; what the demo watches happens in the proxies in front of it.
 */
export async function startDemoUpstream(
  logger: Logger,
): Promise<{ address: string; close(): Promise<void> }> {
  let served = 0;
  const server = createServer((request, response) => {
    served++;
    request.resume();
    const body = `{"ok":true,"served":${served}}\n`;
    response.writeHead(200, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
    });
    response.end(body);
  });
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const address = formatHostPort('127.0.0.1', (server.address() as AddressInfo).port);
  return {
    address,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
        logger.info({ served }, 'upstream stopped');
      }),
  };
}
