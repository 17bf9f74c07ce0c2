import { createServer, type IncomingMessage, request, type Server, type ServerResponse } from 'node:http';
import { type AddressInfo, connect, type Socket } from 'node:net';
import { after } from 'node:test';
import { Registry } from 'prom-client';
import { createProxyBackend, type ProxyBackend } from '../../src/http/proxy/proxy-backend.js';
import { type ProxyServer, startProxyServer } from '../../src/http/proxy/proxy-server.js';
import { parseProxyRules } from '../../src/http/rules/proxy-rules.js';
import { createProxyMetrics } from '../../src/ops/proxy-metrics.js';

/** An upstream on port 0 whose handler a test sets; records every request it saw. */
export interface Upstream {
  server: Server;
  url: string;
  port: number;
  seen: IncomingMessage[];
  handler: (req: IncomingMessage, res: ServerResponse) => void;
  close(): Promise<void>;
}

export type UpstreamHandler = (req: IncomingMessage, res: ServerResponse) => void;

export async function startUpstream(
  handler: UpstreamHandler = (_req, res) => res.end('ok'),
): Promise<Upstream> {
  const upstream: Upstream = {
    server: createServer((req, res) => {
      upstream.seen.push(req);
      upstream.handler(req, res);
    }),
    url: '',
    port: 0,
    seen: [],
    handler,
    close: async () => {
      upstream.server.closeAllConnections();
      await new Promise<void>((resolve) => upstream.server.close(() => resolve()));
    },
  };
  await new Promise<void>((resolve) => upstream.server.listen(0, '127.0.0.1', resolve));
  upstream.port = (upstream.server.address() as AddressInfo).port;
  upstream.url = `http://127.0.0.1:${upstream.port}`;
  return upstream;
}

export interface TestProxy {
  proxy: ProxyServer;
  base: string;
  registry: Registry;
  close(): Promise<void>;
}

/**
 * A proxy in this process from a rules file body (upstream filled in), with the backend the rules
 * name, or `injectedBackend` instead (a fake whose decisions the test controls).
 */
export async function startTestProxy(
  upstreamUrl: string,
  rulesBody: string,
  injectedBackend?: ProxyBackend,
): Promise<TestProxy> {
  const rules = parseProxyRules(
    `version: 1\nupstream:\n  url: ${upstreamUrl}\n${rulesBody}`,
    'test-rules.yaml',
  );
  const registry = new Registry();
  const backend = injectedBackend ?? createProxyBackend(rules.backend, { id: 'test-proxy' });
  const proxy = await startProxyServer({ rules, backend, metrics: createProxyMetrics(registry) });
  return {
    proxy,
    base: `http://${proxy.address}`,
    registry,
    close: async () => {
      await proxy.close({ drainTimeoutMs: 1_000 });
      await backend.close();
    },
  };
}

/**
 * A test file's proxies and upstreams, all closed (newest first) once the file's tests are done.
 * Create one at the top level of the file.
 */
export class ProxyFixtures {
  readonly #closers: (() => Promise<void>)[] = [];

  constructor() {
    after(async () => {
      for (const close of this.#closers.reverse()) await close();
    });
  }

  /** Close these after the file's tests. */
  track(...closers: (() => Promise<void>)[]): void {
    this.#closers.push(...closers);
  }

  /**
   * A proxy from `rulesBody` in front of `upstream`: one already running, a new one with this
   * handler, or a new one answering 200 "ok". `upstreamUrlSuffix` is appended to the upstream line
   * of the rules (e.g. extra upstream options).
   */
  async start(
    rulesBody: string,
    upstream?: Upstream | UpstreamHandler,
    upstreamUrlSuffix = '',
  ): Promise<{ upstream: Upstream; proxy: TestProxy }> {
    const up = typeof upstream === 'object' ? upstream : await startUpstream(upstream);
    const proxy = await startTestProxy(`${up.url}${upstreamUrlSuffix}`, rulesBody);
    this.track(proxy.close, up.close);
    return { upstream: up, proxy };
  }
}

export interface SimpleResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/**
 * One request on a fresh connection (no pooling between test requests). A header given as an
 * array is sent on one line per value; `path` is sent as the request target as is (in `url` the
 * URL parser would rewrite it: `\` becomes `/`).
 */
export function send(
  url: string,
  options: {
    method?: string;
    headers?: Record<string, string | string[]>;
    body?: string;
    path?: string;
  } = {},
): Promise<SimpleResponse> {
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: options.method ?? 'GET',
        headers: options.headers,
        agent: false,
        ...(options.path === undefined ? {} : { path: options.path }),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: Buffer.concat(chunks).toString('utf8'),
          }),
        );
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(options.body);
  });
}

export async function metricValue(
  registry: Registry,
  name: string,
  labels: Record<string, string>,
): Promise<number> {
  const metric = await registry.getSingleMetric(name)?.get();
  const sample = metric?.values.find((v) =>
    Object.entries(labels).every(([k, value]) => v.labels[k] === value),
  );
  return sample?.value ?? 0;
}

/**
 * Writes `text` as is on a fresh TCP connection to `port` and resolves with everything read until
 * the server closes it (for requests a Node client will not send, like CONNECT).
 */
export function rawExchange(port: number, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(text));
    let received = '';
    socket.setEncoding('utf8');
    socket.on('data', (data: string) => {
      received += data;
    });
    socket.on('error', reject);
    socket.on('close', () => resolve(received));
  });
}

export interface UpgradeResult {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /** The upgraded connection (status 101 only). */
  socket?: Socket;
  /** The refusal's body (any status but 101). */
  body?: string;
}

/** A WebSocket-style upgrade request on a fresh connection; resolves with the 101 or the refusal. */
export function openUpgrade(url: string): Promise<UpgradeResult> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent: false, headers: { Connection: 'Upgrade', Upgrade: 'websocket' } });
    req.on('upgrade', (res, socket) =>
      resolve({ status: res.statusCode ?? 0, headers: res.headers, socket }),
    );
    req.on('response', (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        body += chunk;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** Reads a whole request body; resolves with its length, or -1 when the request is cut. */
export function bodyLength(req: IncomingMessage): Promise<number> {
  return new Promise((resolve) => {
    let length = 0;
    req.on('data', (chunk: Buffer) => {
      length += chunk.length;
    });
    req.on('end', () => resolve(length));
    req.on('error', () => resolve(-1));
    req.on('close', () => {
      if (!req.complete) resolve(-1);
    });
  });
}
