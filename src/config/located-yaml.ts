import {
  isAlias,
  isMap,
  isScalar,
  isSeq,
  LineCounter,
  type Node,
  parseDocument,
  type Scalar,
  visit,
} from 'yaml';
import type { z } from 'zod';
import { ErrorCode, SpillwayError } from '../core/errors.js';
import { suggestName } from '../core/validate.js';

/**
 * YAML + zod with errors that point into the file: `limits.yaml:7:11: buckets[1].mode: ...`. Every
 * Spillway config file (the limits file, the proxy's rules) is read through here, so they all fail
 * the same way: ERR_SPILLWAY_INVALID_CONFIG, `file:line:col: <path>: <what>`.
 */
export interface LocatedIssue {
  path: (string | number)[];
  message: string;
  /** Point at the key itself rather than its value (unknown fields). */
  atKey?: boolean;
  /** What the message names, when not the path itself (an unknown field names its parent). */
  label?: string;
}

/**
 * What a file's loader adds to the message for a field it does not know, by name: where the field
 * belongs, when a reader is likely to write it from another file (`limit` of a proxy rule in the
 * limits file).
 */
export type UnknownFieldHints = Readonly<Record<string, string>>;

/**
 * Parses `text` and validates it with `schema`, then `check` (rules the schema cannot express).
 * Throws SpillwayError ERR_SPILLWAY_INVALID_CONFIG, message `file:line:col: <path>: <what>`,
 * details `{ file, line, column, path }`.
 */
export function parseLocatedYaml<S extends z.ZodType, T>(
  text: string,
  fileName: string,
  schema: S,
  check: (value: z.output<S>) => { value: T } | { issue: LocatedIssue },
  hints: UnknownFieldHints = {},
): T {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: false, uniqueKeys: true });
  const yamlError = doc.errors[0];
  if (yamlError) {
    const { line, col } = lineCounter.linePos(yamlError.pos[0]);
    const what = yamlError.message.split('\n')[0]!.replace(/ at line \d+, column \d+:?$/, '');
    throw locatedError(fileName, line, col, undefined, `YAML syntax error: ${what}`);
  }
  if (doc.directives?.yaml.version !== undefined && doc.directives.yaml.version !== '1.2') {
    // YAML 1.1 reads `16:40` as 1000 and turns on merge keys: numbers nobody wrote.
    throw locatedError(
      fileName,
      1,
      1,
      undefined,
      `YAML error: %YAML ${doc.directives.yaml.version} is not supported; Spillway files are YAML 1.2`,
    );
  }
  let unresolved: Node | undefined;
  let nonStringKey: { node: unknown; offset: number } | undefined;
  let duplicateKey: { name: string; offset: number } | undefined;
  visit(doc, {
    Alias(_key, node) {
      if (!node.resolve(doc)) {
        unresolved = node;
        return visit.BREAK;
      }
      return undefined;
    },
    Pair(_key, pair) {
      // Every map in a Spillway file is keyed by names. A key YAML reads as something else would
      // be renamed on the way: `007:` and `1e3:` are the numbers 7 and 1000, so keys "7" and
      // "1000". Accepted: strings, and whole numbers written as they print (`42:`, a tenant id).
      const key = pair.key;
      if (!isScalar(key) || !(typeof key.value === 'string' || isPlainInteger(key))) {
        const offset = isScalar(key) || isMap(key) || isSeq(key) ? (key.range?.[0] ?? 0) : 0;
        nonStringKey = { node: key, offset };
        return visit.BREAK;
      }
      return undefined;
    },
    Map(_key, map) {
      // `42:` and `"42":` are two keys to YAML but one name: refused as a duplicate, as two `42:` are.
      const seen = new Set<string>();
      for (const pair of map.items) {
        if (!isScalar(pair.key)) continue;
        const name = String(pair.key.value);
        if (seen.has(name)) {
          duplicateKey = { name, offset: pair.key.range?.[0] ?? 0 };
          return visit.BREAK;
        }
        seen.add(name);
      }
      return undefined;
    },
  });
  if (duplicateKey !== undefined) {
    const { line, col } = lineCounter.linePos(duplicateKey.offset);
    throw locatedError(fileName, line, col, undefined, `YAML error: key ${duplicateKey.name} is given twice`);
  }
  if (nonStringKey !== undefined) {
    const { line, col } = lineCounter.linePos(nonStringKey.offset);
    const shown = isScalar(nonStringKey.node)
      ? String(nonStringKey.node.source ?? nonStringKey.node.value)
      : '';
    throw locatedError(
      fileName,
      line,
      col,
      undefined,
      shown === ''
        ? 'YAML error: a map key must be a name (a string)'
        : `YAML error: key ${shown} is not a string; quote it ("${shown}") if it is a name`,
    );
  }
  if (unresolved && isAlias(unresolved)) {
    const { line, col } = lineCounter.linePos(unresolved.range?.[0] ?? 0);
    throw locatedError(
      fileName,
      line,
      col,
      undefined,
      `YAML error: alias *${unresolved.source} has no anchor`,
    );
  }
  let input: unknown;
  try {
    input = doc.toJS();
  } catch (error) {
    // The yaml library refuses alias bombs (billion laughs) while converting, with a plain Error.
    const what = error instanceof Error ? error.message : String(error);
    throw locatedError(fileName, 1, 1, undefined, `YAML error: ${what}`);
  }
  const parsed = schema.safeParse(input);
  let issue: LocatedIssue;
  if (parsed.success) {
    const checked = check(parsed.data);
    if ('value' in checked) return checked.value;
    issue = checked.issue;
  } else {
    issue = describeZodIssue(firstIssue(parsed.error.issues), input, schema, hints);
  }
  const offset = locate(doc.contents, issue.path, issue.atKey === true);
  const { line, col } = lineCounter.linePos(offset);
  throw locatedError(
    fileName,
    line,
    col,
    issue.path,
    `${issue.label ?? formatConfigPath(issue.path)}: ${issue.message}`,
  );
}

function locatedError(
  file: string,
  line: number,
  column: number,
  path: (string | number)[] | undefined,
  what: string,
): SpillwayError {
  return new SpillwayError(ErrorCode.InvalidConfig, `${file}:${line}:${column}: ${what}`, {
    file,
    line,
    column,
    path: path === undefined ? undefined : formatConfigPath(path),
  });
}

/**
 * The issue to report of those zod found: an unknown field first, wherever it is. A typo
 * (`limt: 10`) also leaves the field it meant missing, and "limit is required" would send the
 * reader looking for a field they did write.
 */
export function firstIssue(issues: readonly z.core.$ZodIssue[]): z.core.$ZodIssue {
  return issues.find((issue) => issue.code === 'unrecognized_keys') ?? issues[0]!;
}

/** Turn a zod issue into a short message in the file's own vocabulary. */
export function describeZodIssue(
  issue: z.core.$ZodIssue,
  input: unknown,
  schema: z.ZodType,
  hints: UnknownFieldHints = {},
): LocatedIssue {
  const path = issue.path.filter((p): p is string | number => typeof p !== 'symbol');
  const got = valueAt(input, path);
  switch (issue.code) {
    case 'unrecognized_keys': {
      const allowed = allowedFields(schema, path, input);
      const named = issue.keys.map((field) => {
        const hint = Object.hasOwn(hints, field) ? hints[field] : undefined;
        const suggestion = hint === undefined && allowed ? suggestName(field, allowed) : undefined;
        return {
          field,
          note: hint ?? (suggestion === undefined ? undefined : `did you mean "${suggestion}"?`),
        };
      });
      const first = named[0]!;
      const notes = new Set(named.map(({ note }) => note));
      const list =
        named.length === 1 || (notes.size === 1 && first.note !== undefined)
          ? `unknown field${named.length === 1 ? '' : 's'} ${named.map(({ field }) => `"${field}"`).join(', ')}${first.note ? `; ${first.note}` : ''}`
          : `unknown fields ${named.map(({ field, note }) => `"${field}"${note ? ` (${note})` : ''}`).join(', ')}`;
      return {
        path: [...path, first.field],
        atKey: true,
        label: formatConfigPath(path),
        message: `${list}${allowed ? ` (allowed: ${allowed.join(', ')})` : ''}`,
      };
    }
    case 'invalid_type':
      if (got === undefined) return { path, message: `is required (${expectedName(issue.expected)})` };
      return { path, message: `expected ${expectedName(issue.expected)}, got ${describeValue(got)}` };
    case 'invalid_value':
      return {
        path,
        message: `must be ${issue.values.length === 1 ? '' : 'one of '}${issue.values
          .map((v) => JSON.stringify(v))
          .join(', ')}, got ${describeValue(got)}`,
      };
    case 'invalid_union':
      if (issue.discriminator !== undefined) {
        const options = (issue as { options?: unknown[] }).options ?? [];
        const atDiscriminator = path[path.length - 1] === issue.discriminator;
        return {
          path: atDiscriminator ? path : [...path, issue.discriminator],
          message: `must be one of ${options.map((v) => JSON.stringify(v)).join(', ')}, got ${describeValue(
            atDiscriminator ? got : valueAt(got, [issue.discriminator]),
          )}`,
        };
      }
      return { path, message: issue.message };
    case 'too_small':
      return {
        path,
        message: `must be ${issue.inclusive === false ? '>' : '>='} ${String(issue.minimum)}, got ${describeValue(got)}`,
      };
    case 'too_big':
      return {
        path,
        message: `must be ${issue.inclusive === false ? '<' : '<='} ${String(issue.maximum)}, got ${describeValue(got)}`,
      };
    default:
      return { path, message: `${issue.message}, got ${describeValue(got)}` };
  }
}

/**
 * Field names of the object schema at `path`, for "unknown field" messages; through a discriminated
 * union (a backend's `kind`) to the option the input's discriminator selects.
 */
function allowedFields(schema: z.ZodType, path: (string | number)[], input: unknown): string[] | undefined {
  interface Def {
    type?: string;
    shape?: Record<string, unknown>;
    element?: unknown;
    options?: unknown[];
    discriminator?: string;
  }
  const defOf = (at: unknown, value: unknown): Def | undefined => {
    let def = (unwrap(at) as { def?: Def }).def;
    if (def?.type === 'union' && def.discriminator !== undefined && def.options) {
      const chosen = (value as Record<string, unknown> | undefined)?.[def.discriminator];
      const option = def.options.find((candidate) => {
        const literal = (unwrap(candidate) as { def?: Def }).def?.shape?.[def!.discriminator!];
        return ((literal as { def?: { values?: unknown[] } })?.def?.values ?? []).includes(chosen);
      });
      def = option === undefined ? undefined : (unwrap(option) as { def?: Def }).def;
    }
    return def;
  };
  let current: unknown = schema;
  let value = input;
  for (const segment of path) {
    const def = defOf(current, value);
    if (def?.type === 'array' && typeof segment === 'number') current = def.element;
    else if (def?.type === 'object' && typeof segment === 'string') current = def.shape?.[segment];
    else return undefined;
    value = (value as Record<string | number, unknown> | undefined)?.[segment];
  }
  const def = defOf(current, value);
  return def?.type === 'object' && def.shape ? Object.keys(def.shape) : undefined;
}

/** Through optional/default/pipe wrappers to the schema that holds the shape. */
function unwrap(schema: unknown): unknown {
  let current = schema;
  for (let i = 0; i < 10; i++) {
    const def = (current as { def?: { type?: string; innerType?: unknown; in?: unknown } } | undefined)?.def;
    if (!def) return current;
    if (def.innerType !== undefined) current = def.innerType;
    else if (def.type === 'pipe') current = def.in;
    else return current;
  }
  return current;
}

function expectedName(expected: string): string {
  if (expected === 'object') return 'a mapping';
  if (expected === 'array') return 'a list';
  return expected;
}

function valueAt(input: unknown, path: (string | number)[]): unknown {
  let value = input;
  for (const segment of path) {
    if (value === null || typeof value !== 'object') return undefined;
    value = (value as Record<string | number, unknown>)[segment];
  }
  return value;
}

function describeValue(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  if (typeof value === 'string')
    return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}...` : value);
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  return String(value);
}

/** `buckets[1].mode` */
export function formatConfigPath(path: (string | number)[]): string {
  let out = '';
  for (const segment of path) {
    if (typeof segment === 'number') out += `[${segment}]`;
    else out += out === '' ? segment : `.${segment}`;
  }
  return out === '' ? 'top level' : out;
}

/**
 * Offset of the node at `path`, or of the deepest existing ancestor (a missing field points at the
 * mapping that lacks it).
 */
function locate(root: Node | null, path: (string | number)[], atKey: boolean): number {
  let node: Node | null = root;
  let offset = node?.range?.[0] ?? 0;
  for (const [i, segment] of path.entries()) {
    if (isMap(node)) {
      const pair = node.items.find((p) => isScalar(p.key) && String(p.key.value) === String(segment));
      if (!pair) break;
      const isLast = i === path.length - 1;
      if (isLast && atKey && isScalar(pair.key)) return pair.key.range?.[0] ?? offset;
      const value = pair.value as Node | null;
      if (!value?.range) {
        offset = (pair.key as Node).range?.[0] ?? offset;
        break;
      }
      node = value;
    } else if (isSeq(node) && typeof segment === 'number') {
      const item = node.items[segment] as Node | undefined;
      if (!item?.range) break;
      node = item;
    } else {
      break;
    }
    offset = node.range?.[0] ?? offset;
  }
  return offset;
}

/** A whole number written exactly as it prints (`42`, not `042`, `4.2e1` or `0x2a`): its name is its text. */
function isPlainInteger(key: Scalar): boolean {
  return typeof key.value === 'number' && Number.isSafeInteger(key.value) && key.source === String(key.value);
}
