import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import ts from 'typescript';

/**
 * Every ```ts example in docs/ and the README typechecks against the built package, as a reader's
 * code would: each block is written to a module of its own inside this package (so
 * `import ... from 'spillway/redis'` resolves through the package's own `exports` to `dist/`'s
 * declarations) and one compiler run, strict and NodeNext, checks them all. `npm test` builds
 * before it runs the tests. (README's ```js examples run: test/readme.test.ts; YAML examples
 * load: test/docs-examples.test.ts.)
 *
 * A block stands alone, as a reader copies it: it imports what it uses. What it leaves to the
 * reader (an `app`, a `callerId`, a `log`) is declared in a hidden comment that ends on the line
 * above its fence:
 *
 *     <!-- ts-assume
 *     import type { Express } from 'express';
 *     declare const app: Express;
 *     -->
 *
 * A preamble only declares (`import type`, `declare`, `interface`, `type`): it never runs code the
 * reader does not see. Blocks are not joined per doc: the docs' blocks redeclare `app` and
 * `limiter`, and each is read on its own.
 *
 * A block that lists an API's signatures (bodiless functions, as in a .d.ts) is marked
 * `<!-- ts-api spillway/<subpath>` instead, with the same kind of preamble: it is read as ambient
 * declarations, and each name it declares must be assignable both ways with that subpath's export
 * of the same name.
 */
interface Example {
  /** `docs/middleware.md block 3`: the block's number within its file. */
  name: string;
  /** Doc line of the block's opening fence. */
  line: number;
  /** Generated file name, inside the temporary directory. */
  file: string;
  source: string;
  /** Doc line of each generated line (0-based index), so a diagnostic points into the doc. */
  docLines: number[];
  /** Found before compiling: a malformed marker or a preamble that runs code. */
  problems: string[];
}

const docs = [
  ...(existsSync('README.md') ? ['README.md'] : []),
  ...readdirSync('docs')
    .filter((name) => name.endsWith('.md'))
    .sort()
    .map((name) => `docs/${name}`),
];

const examples: Example[] = docs.flatMap((doc) => {
  const lines = readFileSync(doc, 'utf8').split('\n');
  const found: Example[] = [];
  for (let open = 0; open < lines.length; open++) {
    const fence = /^( *)```(?:ts|typescript)\s*$/.exec(lines[open]!);
    if (!fence) continue;
    const indent = fence[1]!;
    let close = open + 1;
    while (close < lines.length && lines[close] !== `${indent}\`\`\``) close++;
    const code = lines.slice(open + 1, close).map((line) => line.slice(indent.length));
    found.push(example(doc, found.length + 1, lines, open, code));
    open = close;
  }
  return found;
});

/** `open` is the 0-based index of the opening fence: doc line `open + 1`. */
function example(doc: string, index: number, lines: string[], open: number, code: string[]): Example {
  const name = `${doc} block ${index}`;
  const line = open + 1;
  const base = `${doc.replace(/^docs\//, '').replace(/\.md$/, '')}-${index}`;
  const marker = findMarker(lines, open);
  const problems: string[] = [];
  if (marker && !/^<!-- ts-(assume|api spillway(\/[a-z/]+)?)$/.test(marker.header)) {
    problems.push(`${name} (line ${marker.at + 1}): unknown marker ${marker.header}`);
  }
  const preamble = marker?.preamble ?? [];
  const preambleLines = preamble.map((_, i) => marker!.at + 2 + i);
  problems.push(...preambleProblems(name, preamble, preambleLines));
  const api = /^<!-- ts-api (\S+)$/.exec(marker?.header ?? '')?.[1];
  const codeLines = code.map((_, i) => line + 1 + i);
  const body = api ? ['declare namespace Doc {', ...code, '}'] : code;
  const bodyLines = api ? [line, ...codeLines, line + code.length + 1] : codeLines;
  const { checks, checkLines } = api ? apiChecks(code, codeLines, api) : { checks: [], checkLines: [] };
  return {
    name,
    line,
    file: `${base}.ts`,
    source: [...preamble, ...body, ...checks].join('\n'),
    docLines: [...preambleLines, ...bodyLines, ...checkLines],
    problems,
  };
}

/** The hidden comment whose `-->` is the line just above the fence at `open`, if any. */
function findMarker(
  lines: string[],
  open: number,
): { header: string; at: number; preamble: string[] } | undefined {
  if (lines[open - 1]?.trim() !== '-->') return undefined;
  for (let at = open - 2; at >= 0; at--) {
    const header = lines[at]!.trim();
    if (header.startsWith('<!--')) {
      return header.startsWith('<!-- ts-')
        ? { header, at, preamble: lines.slice(at + 1, open - 1) }
        : undefined;
    }
  }
  return undefined;
}

/** A preamble statement that is not a declaration would make the example work by hidden code. */
function preambleProblems(name: string, preamble: string[], docLines: number[]): string[] {
  const source = ts.createSourceFile('preamble.ts', preamble.join('\n'), ts.ScriptTarget.ES2022, true);
  return source.statements
    .filter((statement) => !declaresOnly(statement))
    .map((statement) => {
      const at = source.getLineAndCharacterOfPosition(statement.getStart(source)).line;
      return `${name} (line ${docLines[at]}): a preamble only declares (import type, declare, interface, type), found: ${statement.getText(source).split('\n')[0]}`;
    });
}

function declaresOnly(statement: ts.Statement): boolean {
  if (ts.isInterfaceDeclaration(statement) || ts.isTypeAliasDeclaration(statement)) return true;
  if (ts.isImportDeclaration(statement)) {
    const clause = statement.importClause;
    if (!clause || clause.name) return clause?.isTypeOnly === true;
    const bindings = clause.namedBindings;
    return (
      clause.isTypeOnly ||
      (bindings !== undefined &&
        ts.isNamedImports(bindings) &&
        bindings.elements.every((element) => element.isTypeOnly))
    );
  }
  return (
    ts.canHaveModifiers(statement) &&
    (ts.getModifiers(statement) ?? []).some((m) => m.kind === ts.SyntaxKind.DeclareKeyword)
  );
}

/**
 * One generated line per name an API listing declares, each assigning the listed shape to the
 * real one and back; a mismatch is reported at the line that declares the name.
 */
function apiChecks(
  code: string[],
  codeLines: number[],
  api: string,
): { checks: string[]; checkLines: number[] } {
  const listing = ts.createSourceFile('listing.ts', code.join('\n'), ts.ScriptTarget.ES2022, true);
  const checks = [`import type * as Api from '${api}';`];
  const checkLines = [codeLines[0]! - 1]; // the opening fence
  const seen = new Set<string>();
  for (const statement of listing.statements) {
    const names = ts.isVariableStatement(statement)
      ? statement.declarationList.declarations.map((d) => d.name.getText(listing))
      : [(statement as ts.DeclarationStatement).name?.getText(listing)];
    const isType = ts.isInterfaceDeclaration(statement) || ts.isTypeAliasDeclaration(statement);
    for (const id of names) {
      if (id === undefined || seen.has(id)) continue;
      seen.add(id);
      const [listed, real] = isType ? [`Doc.${id}`, `Api.${id}`] : [`typeof Doc.${id}`, `typeof Api.${id}`];
      const at = codeLines[listing.getLineAndCharacterOfPosition(statement.getStart(listing)).line]!;
      checks.push(`((listed: ${listed}, real: ${real}): [${real}, ${listed}] => [listed, real]);`);
      checkLines.push(at);
      if (isType) {
        // Optional members are assignable both ways whether listed or not: their names must match too.
        checks.push(
          `((listed: keyof ${listed}, real: keyof ${real}): [keyof ${real}, keyof ${listed}] => [listed, real]);`,
        );
        checkLines.push(at);
      }
    }
  }
  return { checks, checkLines };
}

const compilerOptions = {
  target: 'ES2022',
  lib: ['ES2023'],
  module: 'NodeNext',
  moduleResolution: 'NodeNext',
  types: ['node'],
  strict: true,
  noEmit: true,
  skipLibCheck: true,
};

describe('docs TypeScript examples', () => {
  let dir = '';
  /** Messages per example name; those outside any example under ''. */
  const failures = new Map<string, Set<string>>();

  before(() => {
    assert.ok(existsSync('dist/src/index.d.ts'), 'dist/ is missing: run `npm run build` first');
    dir = mkdtempSync(join(process.cwd(), '.tmp-docs-ts-'));
    for (const { file, source } of examples) writeFileSync(join(dir, file), source);
    writeFileSync(
      join(dir, 'tsconfig.json'),
      JSON.stringify({ compilerOptions, files: examples.map((e) => e.file) }, null, 2),
    );
    const config = ts.getParsedCommandLineOfConfigFile(join(dir, 'tsconfig.json'), undefined, {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) =>
        assert.fail(ts.flattenDiagnosticMessageText(d.messageText, '\n')),
    })!;
    const program = ts.createProgram({ rootNames: config.fileNames, options: config.options });
    const byFile = new Map(examples.map((e) => [join(dir, e.file), e]));
    for (const d of [...config.errors, ...ts.getPreEmitDiagnostics(program)]) {
      const text = ts
        .flattenDiagnosticMessageText(d.messageText, '\n    ')
        .replaceAll(`${process.cwd()}/`, '');
      const owner = d.file && byFile.get(d.file.fileName);
      const where =
        owner && d.start !== undefined
          ? `${owner.name} (line ${owner.docLines[d.file!.getLineAndCharacterOfPosition(d.start).line]})`
          : (d.file?.fileName ?? 'compiler');
      const messages = failures.get(owner?.name ?? '') ?? new Set<string>();
      failures.set(owner?.name ?? '', messages.add(`${where}: ${text}`));
    }
  });
  after(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('has examples', () => assert.ok(examples.length >= 10, `found ${examples.length} ts blocks`));

  for (const { name, line, problems } of examples) {
    it(`${name} (line ${line}) typechecks`, () => {
      assert.deepEqual([...problems, ...(failures.get(name) ?? [])], []);
    });
  }

  it('the compiler reports nothing outside the examples', () => {
    assert.deepEqual([...(failures.get('') ?? [])], []);
  });
});
