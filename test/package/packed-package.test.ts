import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

/**
 * The package as users get it: `npm pack`, installed from the tarball into an empty folder, then
 * used from there. Every subpath in `exports` must import and offer the same named exports as its
 * source `index.ts` (each the same kind of value), its declarations must be in the tarball, and
 * the `spillway` command must run. Catches what the tests that run from the source tree cannot: a
 * folder missing from `files`, an export pointing to a file the build does not write, a runtime
 * import of a dev dependency, a bin that cannot find its code.
 *
 * `npm pack --ignore-scripts` packs the build already in dist/ (`npm test` builds first; it is
 * built here when missing): the `prepare` script would rebuild dist/ while other test files read
 * it. The install skips install scripts too: better-sqlite3 compiles SQLite when no prebuilt
 * binary downloads (minutes), and it is loaded only when a SQLite history store is opened, which
 * importing `spillway/control/tuning` does not do.
 */
const run = promisify(execFile);
const repo = fileURLToPath(new URL('../..', import.meta.url));
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

interface PackageJson {
  version: string;
  bin: Record<string, string>;
  exports: Record<string, string | { types: string; default: string }>;
}
const packageJson = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8')) as PackageJson;

/** `./redis` → `spillway/redis`, with the source module its build comes from. */
const modules = Object.entries(packageJson.exports).flatMap(([subpath, target]) =>
  typeof target === 'string'
    ? []
    : [
        {
          specifier: `spillway${subpath.slice(1)}`,
          types: target.types,
          source: join(repo, target.default.replace(/^\.\/dist\//, '').replace(/\.js$/, '.ts')),
        },
      ],
);

/** Prints, for each specifier, its export names and the `typeof` of each. */
const IMPORT_SCRIPT = `
const specifiers = JSON.parse(process.argv[2]);
const shapes = {};
for (const specifier of specifiers) {
  const module = await import(specifier);
  shapes[specifier] = Object.fromEntries(Object.keys(module).sort().map((name) => [name, typeof module[name]]));
}
const proto = import.meta.resolve('spillway/proto/spillway/v1/control.proto');
process.stdout.write(JSON.stringify({ shapes, proto }));
`;

describe('the packed package', { timeout: 600_000 }, () => {
  let dir: string;
  let app: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'spillway-packed-'));
    app = join(dir, 'app');
    mkdirSync(app);
    if (!existsSync(join(repo, 'dist/src/index.js'))) await run(npm, ['run', 'build'], { cwd: repo });
    const { stdout } = await run(npm, ['pack', '--ignore-scripts', '--json', '--pack-destination', dir], {
      cwd: repo,
      maxBuffer: 64 * 1024 * 1024,
    });
    const [packed] = JSON.parse(stdout) as { filename: string }[];
    // A package.json of its own, so npm installs here rather than in a folder above.
    writeFileSync(join(app, 'package.json'), '{ "name": "packed-package-test", "private": true }\n');
    await run(
      npm,
      [
        'install',
        '--no-audit',
        '--no-fund',
        '--prefer-offline',
        '--ignore-scripts',
        '--no-package-lock',
        join(dir, packed!.filename),
      ],
      { cwd: app, maxBuffer: 64 * 1024 * 1024 },
    );
  });

  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('offers every subpath export with the named exports of its source, and its declarations', async () => {
    assert.ok(modules.length >= 10, `only ${modules.length} subpaths in package.json exports`);
    const scriptPath = join(app, 'import-every-export.mjs');
    writeFileSync(scriptPath, IMPORT_SCRIPT);
    const { stdout } = await run(
      process.execPath,
      [scriptPath, JSON.stringify(modules.map((m) => m.specifier))],
      { cwd: app, maxBuffer: 16 * 1024 * 1024 },
    );
    const { shapes, proto } = JSON.parse(stdout) as {
      shapes: Record<string, Record<string, string>>;
      proto: string;
    };
    const installed = join(app, 'node_modules/spillway');
    for (const { specifier, types, source } of modules) {
      const expected = await import(pathToFileURL(source).href);
      const expectedShape = Object.fromEntries(
        Object.keys(expected)
          .sort()
          .map((name) => [name, typeof expected[name]]),
      );
      assert.ok(Object.keys(expectedShape).length > 0, `${source} exports nothing`);
      assert.deepEqual(shapes[specifier], expectedShape, `${specifier}: named exports differ from ${source}`);
      assert.ok(existsSync(join(installed, types)), `${specifier}: ${types} is not in the package`);
    }
    assert.ok(existsSync(new URL(proto)), `spillway/proto/… resolves to ${proto}, which is missing`);
  });

  it('runs the spillway command', async () => {
    const bin = join(app, 'node_modules/.bin/spillway');
    const help = await run(bin, ['--help'], { cwd: app });
    assert.match(help.stdout, /^Usage: spillway <command> \[options\]/);
    for (const command of ['aggregator', 'controller', 'demo', 'host', 'proxy', 'sim', 'tune']) {
      assert.match(help.stdout, new RegExp(`^ {2}${command} `, 'm'), `--help lists ${command}`);
    }
    const version = await run(bin, ['--version'], { cwd: app });
    assert.equal(version.stdout.trim(), packageJson.version);
  });
});
