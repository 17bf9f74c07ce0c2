import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { type RedisServer, requireRedis, startRedis } from './helpers/redis-server.js';

/**
 * The README's examples are executed as a user would run them: each ```js block is written to a
 * module inside this package (so `import ... from 'spillway/local'` resolves through the package's
 * own `exports`, against the built `dist/`) and run by Node. A README example that no longer
 * works fails here. `npm test` builds before it runs the tests.
 */
const run = promisify(execFile);
const blocks = [...readFileSync('README.md', 'utf8').matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);

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
      const { stderr } = await run(process.execPath, [file], {
        env: { ...process.env, REDIS_URL: redis?.url ?? '' },
        timeout: 20_000,
      });
      assert.doesNotMatch(stderr, /Error/);
    });
  });
});
