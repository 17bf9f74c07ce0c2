import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { headerHash } from '../../src/http/rules/key-template.js';
import { startUpstream } from '../http/proxy-harness.js';
import {
  REPO_ROOT,
  type SpillwayProcess,
  scrape,
  seriesKey,
  startSpillway,
  stopSpillway,
  waitFor,
} from './spillway-process.js';

/**
 * README "Running the global limiter", as a reader runs it: a controller on examples/limits.yaml,
 * a zone aggregator, and `spillway proxy` on examples/proxy-rules-global.yaml, the files as they
 * are (only the addresses changed, to free ports and a test upstream). The example override
 * applies end to end (issue #35: `x-api-key: acme` was held at the template's 100/s because the
 * override named `acme` while the proxy keys callers by the key's hash), and a caller without an
 * override gets the template's limit.
 */
describe('the example limits and proxy rules, run together', { timeout: 90_000 }, () => {
  const started: SpillwayProcess[] = [];
  const dir = mkdtempSync(join(tmpdir(), 'spillway-examples-'));
  after(async () => {
    for (const p of started.reverse()) await stopSpillway(p, 3_000);
    rmSync(dir, { recursive: true, force: true });
  });

  it("acme's override reaches the proxy; another caller gets the template's limit", async (t) => {
    const upstream = await startUpstream((_req, res) => res.end('ok'));
    t.after(upstream.close);
    const anyPort = ['--listen', '127.0.0.1:0', '--ops', '127.0.0.1:0'];
    const controller = await startSpillway('controller', [
      'controller',
      '--config',
      join(REPO_ROOT, 'examples/limits.yaml'),
      ...anyPort,
    ]);
    started.push(controller);
    const aggregator = await startSpillway('aggregator', [
      'aggregator',
      '--zone',
      'z1',
      '--parent',
      controller.grpc!,
      ...anyPort,
    ]);
    started.push(aggregator);
    const example = readFileSync(join(REPO_ROOT, 'examples/proxy-rules-global.yaml'), 'utf8');
    const rules = example
      .replace('url: http://127.0.0.1:3000', `url: ${upstream.url}`)
      .replace('aggregators: [127.0.0.1:7071]', `aggregators: [${aggregator.grpc}]`);
    assert.notEqual(rules, example);
    const rulesPath = join(dir, 'proxy-rules-global.yaml');
    writeFileSync(rulesPath, rules);
    const proxy = await startSpillway('proxy', ['proxy', '--config', rulesPath, ...anyPort]);
    started.push(proxy);
    const base = `http://${(JSON.parse(proxy.output.find((l) => l.includes('"listening"'))!) as { proxy: string }).proxy}`;

    const limitOf = async (caller: string) => {
      const response = await fetch(`${base}/v1/search`, { headers: { 'x-api-key': caller } });
      await response.arrayBuffer();
      assert.equal(response.status, 200);
      const metrics = await scrape(proxy.ops);
      return metrics.get(seriesKey('spillway_limit_rps', { bucket: `api:caller=${headerHash(caller)}` }));
    };
    const limits = await waitFor(
      'directives for both callers',
      async () => {
        const [acme, zed] = [await limitOf('acme'), await limitOf('zed')];
        return acme && zed ? { acme, zed } : undefined;
      },
      { timeoutMs: 30_000 },
    );
    assert.deepEqual(limits, { acme: 1000, zed: 100 });
    const search = (await scrape(proxy.ops)).get(seriesKey('spillway_limit_rps', { bucket: 'search:query' }));
    assert.equal(search, 200);
    // The rule says 100 a second for every caller in RateLimit-Policy: the proxy says acme's differs.
    await waitFor(
      "the proxy's warning that acme's limit is not the rule's",
      async () =>
        proxy.output.some((l) => l.includes('bucket \\"per-caller\\" says 100 per 1 s')) ? true : undefined,
      { timeoutMs: 15_000 },
    );
    assert.ok(!proxy.output.some((l) => l.includes('got no directive')), 'every example key has a rule');
  });
});
