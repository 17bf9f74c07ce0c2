import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { type RedisServer, requireRedis, startRedis } from './helpers/redis-server.js';

/**
 * The README's examples are executed as a user would run them: each ```js block is written to a
 * module inside this package (so `import ... from 'spillway/local'` resolves through the package's
 * own `exports`, against the built `dist/`) and run by Node. A README example that no longer
 * works fails here. `npm test` builds before it runs the tests.
 *
 * What an example says it prints (`// prints: true 99 counted in Redis`) is what it must print, line
 * for line: an example that runs but does something else than its text claims (a Redis example
 * that only ever fails open) fails too.
 */
const run = promisify(execFile);
const readme = readFileSync('README.md', 'utf8');
const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);

/** The lines a block says it prints, in order. */
function printed(code: string): string[] {
  return [...code.matchAll(/\/\/ prints: (.*)$/gm)].map((m) => m[1]!.trim());
}

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe('README examples', () => {
  let redis: RedisServer | undefined;
  const dir = mkdtempSync(join(process.cwd(), '.tmp-readme-'));

  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    await redis?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('has examples', () => {
    assert.ok(blocks.length >= 4, `found ${blocks.length} js blocks`);
  });

  blocks.forEach((code, index) => {
    const firstImport = /from '([^']+)'/.exec(code)?.[1] ?? 'no import';
    it(`example ${index + 1} (${firstImport}) runs`, async (t) => {
      if (code.includes('REDIS_URL') && !requireRedis(t)) return;
      const file = join(dir, `example-${index + 1}.mjs`);
      writeFileSync(file, code);
      const { stdout, stderr } = await run(process.execPath, [file], {
        env: { ...process.env, REDIS_URL: redis?.url ?? '' },
        timeout: 20_000,
      });
      assert.doesNotMatch(stderr, /Error|fail-open/);
      const expected = printed(code);
      if (expected.length > 0) assert.deepEqual(stdout.trim().split('\n'), expected);
    });
  });

  it('the Redis example fails open with Redis down, and logs it, as its text says', async (t) => {
    const index = blocks.findIndex((code) => code.includes('REDIS_URL'));
    assert.ok(index >= 0, 'no Redis example');
    if (!requireRedis(t)) return;
    const claim = /With Redis down the same code prints `([^`]+)`, and the logger gets\s+`([^`]+)`/.exec(
      readme,
    );
    assert.ok(claim, 'the README says what the Redis example does with Redis down');
    const file = join(dir, `example-${index + 1}-redis-down.mjs`);
    writeFileSync(file, blocks[index]!);
    const { stdout, stderr } = await run(process.execPath, [file], {
      env: { ...process.env, REDIS_URL: `redis://127.0.0.1:${await closedPort()}` },
      timeout: 20_000,
    });
    assert.equal(stdout.trim(), claim[1]);
    assert.ok(stderr.includes(claim[2]!), stderr);
  });
});
