import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import ts from 'typescript';

/**
 * docs/middleware.md's Express and Fastify examples run, as a reader pastes them, and do what the
 * text says: one request is charged once (issue #35: a snippet with `app.use(limit)` and the route's
 * own `limit` charged every request twice). Each ```ts block is transpiled as it stands, what its
 * hidden preamble only declares is given a value here (a handler, a limiter), and one request is
 * sent; the `RateLimit` field tells how many units it cost. (Every block also typechecks:
 * test/docs-typescript.test.ts.)
 */
const run = promisify(execFile);
const lines = readFileSync('docs/middleware.md', 'utf8').split('\n');

/** The ```ts blocks of the doc, in order. */
const blocks: string[] = [];
for (let i = 0; i < lines.length; i++) {
  if (lines[i] !== '```ts') continue;
  const end = lines.indexOf('```', i + 1);
  blocks.push(lines.slice(i + 1, end).join('\n'));
  i = end;
}

/** What the preambles declare, as values; then one request, its RateLimit field printed. */
const values = `
const searchHandler = (_req, res) => { res.end ? res.end('ok') : res.send('ok'); };
const limiter = (await import('spillway/local')).createKeyedTokenBucket({ capacity: 100, refillPerSec: 10 });
`;
const expressRequest = `
const server = app.listen(0, '127.0.0.1');
await new Promise((resolve) => server.once('listening', resolve));
const response = await fetch(\`http://127.0.0.1:\${server.address().port}/search\`, { method: 'POST' });
console.log(response.status, response.headers.get('ratelimit'));
server.close();
`;
const fastifyRequest = `
await app.ready();
const response = await app.inject({ method: 'GET', url: '/search' });
console.log(response.statusCode, response.headers.ratelimit);
await app.close();
`;

const cases = [
  {
    name: 'Express, every route (app.use)',
    index: 0,
    request: expressRequest,
    printed: '200 "api";r=99;t=1',
  },
  { name: 'Express, some routes only', index: 1, request: expressRequest, printed: '200 "search";r=19;t=1' },
  {
    name: 'Fastify, every route (register)',
    index: 2,
    request: fastifyRequest,
    printed: '200 "api";r=99;t=1',
  },
  { name: 'Fastify, some routes only', index: 3, request: fastifyRequest, printed: '200 "search";r=99;t=1' },
];

describe('docs/middleware.md examples charge a request once', () => {
  let dir = '';
  before(() => {
    assert.ok(existsSync('dist/src/index.d.ts'), 'dist/ is missing: run `npm run build` first');
    dir = mkdtempSync(join(process.cwd(), '.tmp-docs-mw-'));
  });
  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  for (const { name, index, request, printed } of cases) {
    it(name, async () => {
      const code = blocks[index];
      assert.ok(code, `docs/middleware.md has no ts block ${index + 1}`);
      assert.match(code, /charged once|instead of|only/, 'the block says how often a request is charged');
      const js = ts.transpileModule(code, {
        compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
      }).outputText;
      // Imports first (hoisted anyway), then the values the preamble declared, then the rest.
      const imports = js.split('\n').filter((line) => line.startsWith('import '));
      const body = js.split('\n').filter((line) => !line.startsWith('import '));
      const file = join(dir, `block-${index + 1}.mjs`);
      writeFileSync(file, [...imports, values, ...body, request].join('\n'));
      const { stdout } = await run(process.execPath, [file], { timeout: 20_000 });
      assert.equal(stdout.trim(), printed);
    });
  }
});
