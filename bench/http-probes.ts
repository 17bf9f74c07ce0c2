// Pieces the HTTP benchmarks share (bench/edge.bench.ts, bench/edge-instructions.bench.ts,
// scripts/profile-proxy.ts): the upstream every case forwards to, the proxy rules files, and the
// CPU-time probe of the process under test.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * The upstream role: 200 "ok" to everything, keep-alive, on a free loopback port announced as a
 * `listening` line (`{"msg":"listening","http":"127.0.0.1:<port>"}`) like the spillway processes'.
 */
export async function runOkUpstream(): Promise<void> {
  const server = http.createServer((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '2' });
    res.end('ok');
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  process.stdout.write(
    `${JSON.stringify({ msg: 'listening', http: `127.0.0.1:${(server.address() as AddressInfo).port}` })}\n`,
  );
}

const CLOCK_TICKS_PER_SEC = Number(spawnSync('getconf', ['CLK_TCK']).stdout?.toString().trim()) || 100;

/**
 * CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat; NaN where /proc is
 * missing. CPU per request moves far less with other load on the machine than latency does, so it
 * shows what a decision costs even when wall-clock figures are noisy.
 */
export function cpuSeconds(pid: number | undefined): number {
  if (pid === undefined) return Number.NaN;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may contain spaces) start at state, field 3.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SEC;
  } catch {
    return Number.NaN;
  }
}

/** Upstream connections pooled by every forwarding case (the proxy's default, docs/proxy.md). */
export const UPSTREAM_SOCKETS = 128;

/** A `spillway proxy` rules file (docs/proxy.md). */
export function proxyRules(upstream: string, backend: string[], buckets: string[]): string {
  return [
    'version: 1',
    'upstream:',
    `  url: http://${upstream}`,
    `  connections: ${UPSTREAM_SOCKETS}`,
    // The load generator is one client address with many connections: the per-client bound on
    // request bodies in progress (16 by default) would refuse its POST runs.
    'server:',
    '  maxUploadsPerClient: 0',
    'backend:',
    ...backend.map((line) => `  ${line}`),
    buckets.length === 0 ? 'buckets: []' : 'buckets:',
    ...buckets.map((line) => `  ${line}`),
    '',
  ].join('\n');
}

export function proxyBucket(name: string, limit: number, windowSec: number, key?: string): string[] {
  return [
    `- name: ${name}`,
    ...(key === undefined ? [] : [`  key: "${key}"`]),
    `  limit: ${limit}`,
    `  windowSec: ${windowSec}`,
  ];
}
