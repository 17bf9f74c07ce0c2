// Issue #28's bounds, held: no file under src/ over 500 lines (generated code excepted), and no
// function over 150 lines in the control plane and the HTTP edge, the code that grew into closures
// of hundreds of lines before.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { test } from 'node:test';
import ts from 'typescript';

const MAX_FILE_LINES = 500;
const MAX_FUNCTION_LINES = 150;
const FUNCTION_BOUND_FOLDERS = ['src/control', 'src/http'];

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'gen' ? [] : sourceFiles(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

/** Each function-like node's name (or kind) and its length in lines. */
function functionLengths(file: string): { name: string; lines: number }[] {
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
  const out: { name: string; lines: number }[] = [];
  const visit = (node: ts.Node) => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body !== undefined) {
      const start = source.getLineAndCharacterOfPosition(node.getStart(source)).line;
      const end = source.getLineAndCharacterOfPosition(node.getEnd()).line;
      const name = node.name && ts.isIdentifier(node.name) ? node.name.text : ts.SyntaxKind[node.kind];
      out.push({ name, lines: end - start + 1 });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return out;
}

test(`no file under src/ is over ${MAX_FILE_LINES} lines (generated code excepted)`, () => {
  const over = sourceFiles('src')
    .map((file) => ({ file, lines: readFileSync(file, 'utf8').split('\n').length }))
    .filter(({ lines }) => lines > MAX_FILE_LINES)
    .map(({ file, lines }) => `${file}: ${lines}`);
  assert.deepEqual(over, []);
});

test(`no function in ${FUNCTION_BOUND_FOLDERS.join(' or ')} is over ${MAX_FUNCTION_LINES} lines`, () => {
  const over: string[] = [];
  for (const folder of FUNCTION_BOUND_FOLDERS) {
    for (const file of sourceFiles(folder)) {
      for (const { name, lines } of functionLengths(file)) {
        if (lines > MAX_FUNCTION_LINES) over.push(`${relative('.', file)} ${name}: ${lines}`);
      }
    }
  }
  assert.deepEqual(over, []);
});

test('the function measure sees a function and its length', () => {
  const lengths = functionLengths('test/structure-bounds.test.ts');
  assert.ok(lengths.some((entry) => entry.name === 'functionLengths' && entry.lines > 10));
});
