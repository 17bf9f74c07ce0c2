// The layering of DESIGN.md ("Layout"), read from the imports: a module under src/ imports only
// from its own layer or the layers listed before it, so the folder tree stays the architecture
// diagram. A new top-level folder must be placed in LAYERS before it can be imported.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'node:test';

/** In order; folders on one line are one layer (they may import each other). */
const LAYERS: readonly (readonly string[])[] = [
  ['core'],
  ['gen', 'protocol'],
  ['local', 'redis'],
  ['config'],
  ['transport'],
  ['global'],
  ['control'],
  ['server'],
  ['http'],
  ['envoy'],
  ['ops', 'dashboard'],
  ['sim'],
  ['cli'],
];

const SRC = resolve('src');
const rank = new Map<string, number>();
LAYERS.forEach((layer, index) => {
  for (const folder of layer) rank.set(folder, index);
});

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

/** Relative import specifiers, static and dynamic, type-only included. */
function relativeImports(source: string): string[] {
  const out: string[] = [];
  for (const match of source.matchAll(/(?:from|import\s*\()\s*'(\.{1,2}\/[^']+)'/g)) out.push(match[1]!);
  return out;
}

/** `core` for src/core/clock.ts; undefined for files at the root of src/ (index.ts). */
function layerOf(file: string): string | undefined {
  const parts = relative(SRC, file).split('/');
  return parts.length > 1 ? parts[0] : undefined;
}

test('every folder under src/ has a place in the layer order', () => {
  const folders = readdirSync(SRC).filter((name) => statSync(join(SRC, name)).isDirectory());
  assert.deepEqual(
    folders.filter((folder) => !rank.has(folder)),
    [],
    'add the folder to LAYERS here and to DESIGN.md',
  );
});

test('no module imports from a layer below its own (DESIGN.md, "Layout")', () => {
  const upward: string[] = [];
  for (const file of sourceFiles(SRC)) {
    const from = layerOf(file);
    if (from === undefined) continue;
    for (const specifier of relativeImports(readFileSync(file, 'utf8'))) {
      const target = resolve(dirname(file), specifier);
      assert.ok(target.startsWith(SRC), `${relative(SRC, file)} imports ${specifier}, outside src/`);
      const to = layerOf(target);
      if (to === undefined) {
        upward.push(`${relative(SRC, file)} -> ${specifier} (the root entry)`);
        continue;
      }
      if (rank.get(to)! > rank.get(from)!) upward.push(`${relative(SRC, file)} -> ${specifier}`);
    }
  }
  assert.deepEqual(upward, []);
});

test('the check itself sees an upward import', () => {
  const imports = relativeImports(
    "import { x } from '../control/y.js';\nconst m = await import('../http/z.js');",
  );
  assert.deepEqual(imports, ['../control/y.js', '../http/z.js']);
});
