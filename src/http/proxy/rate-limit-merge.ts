/**
 * Merges the proxy's `RateLimit` / `RateLimit-Policy` fields with those an upstream sent, so that
 * a client is never told it has more quota than either party grants:
 *
 * - Both are Structured Field Lists, so the two sides' members are combined into one list.
 * - A policy name on both sides is one policy: the member with the lower `r` (remaining) is kept,
 *   with its side's `RateLimit-Policy` member; on a tie the upstream's is kept. An upstream policy
 *   with no `r` of its own loses to the proxy's, which has one.
 * - An upstream field that does not parse is kept byte for byte and the proxy's members are
 *   appended after it (what combining two field lines means in RFC 9110 §5.3): nothing the
 *   upstream said is dropped or loosened.
 */
export interface MergedRateLimitFields {
  policy: string | undefined;
  limit: string | undefined;
}

interface Member {
  name: string;
  /** The member as text, re-emitted unchanged. */
  text: string;
  params: Map<string, string>;
}

export function mergeRateLimitFields(
  ours: { policy: string | undefined; limit: string | undefined },
  upstream: { policy: string | string[] | undefined; limit: string | string[] | undefined },
): MergedRateLimitFields {
  const upstreamPolicyText = joinField(upstream.policy);
  const upstreamLimitText = joinField(upstream.limit);
  if (upstreamPolicyText === undefined && upstreamLimitText === undefined) return ours;
  const upstreamPolicy = upstreamPolicyText === undefined ? [] : parseList(upstreamPolicyText);
  const upstreamLimit = upstreamLimitText === undefined ? [] : parseList(upstreamLimitText);
  const ourPolicy = ours.policy === undefined ? [] : (parseList(ours.policy) ?? []);
  const ourLimit = ours.limit === undefined ? [] : (parseList(ours.limit) ?? []);
  if (upstreamPolicy === undefined || upstreamLimit === undefined) {
    return {
      policy: concat(upstreamPolicyText, ours.policy),
      limit: concat(upstreamLimitText, ours.limit),
    };
  }
  // Names where the proxy's entry is stricter: its members replace the upstream's.
  const oursWins = new Set<string>();
  const upstreamRemaining = new Map(upstreamLimit.map((m) => [m.name, remainingOf(m)]));
  const upstreamNames = new Set([...upstreamPolicy.map((m) => m.name), ...upstreamLimit.map((m) => m.name)]);
  for (const member of ourLimit) {
    const theirs = upstreamRemaining.get(member.name);
    if (theirs === undefined || remainingOf(member) < theirs) oursWins.add(member.name);
  }
  const mergeLists = (theirs: Member[], mine: Member[]): string | undefined => {
    const out: string[] = [];
    for (const member of theirs) {
      if (oursWins.has(member.name)) {
        const replacement = mine.find((m) => m.name === member.name);
        if (replacement) out.push(replacement.text);
      } else {
        out.push(member.text);
      }
    }
    for (const member of mine) {
      if (!upstreamNames.has(member.name)) out.push(member.text);
    }
    return out.length > 0 ? out.join(', ') : undefined;
  };
  return { policy: mergeLists(upstreamPolicy, ourPolicy), limit: mergeLists(upstreamLimit, ourLimit) };
}

function remainingOf(member: Member): number {
  const value = Number(member.params.get('r'));
  return Number.isFinite(value) ? value : Number.POSITIVE_INFINITY;
}

function joinField(value: string | string[] | undefined): string | undefined {
  if (value === undefined) return undefined;
  const text = typeof value === 'string' ? value : value.join(', ');
  return text.trim() === '' ? undefined : text;
}

function concat(first: string | undefined, second: string | undefined): string | undefined {
  if (first === undefined) return second;
  if (second === undefined) return first;
  return `${first}, ${second}`;
}

/**
 * A Structured Field List whose members are strings or tokens with parameters (what the
 * rate limit fields use). Undefined when the text is not one: inner lists, bad syntax.
 */
function parseList(text: string): Member[] | undefined {
  const members: Member[] = [];
  let i = 0;
  const skipSpaces = () => {
    while (i < text.length && (text[i] === ' ' || text[i] === '\t')) i++;
  };
  skipSpaces();
  if (i === text.length) return [];
  for (;;) {
    const start = i;
    let name: string;
    if (text[i] === '"') {
      i++;
      name = '';
      for (;;) {
        if (i >= text.length) return undefined;
        const c = text[i]!;
        if (c === '\\') {
          const next = text[i + 1];
          if (next !== '"' && next !== '\\') return undefined;
          name += next;
          i += 2;
        } else if (c === '"') {
          i++;
          break;
        } else {
          name += c;
          i++;
        }
      }
    } else {
      const match = /^[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*/.exec(text.slice(i));
      if (!match) return undefined;
      name = match[0];
      i += name.length;
    }
    const params = new Map<string, string>();
    while (text[i] === ';') {
      i++;
      skipSpaces();
      const match = /^([a-z*][a-z0-9_\-.*]*)(?:=("(?:[^"\\]|\\.)*"|[^;,\s]+))?/.exec(text.slice(i));
      if (!match) return undefined;
      params.set(match[1]!, match[2] ?? '?1');
      i += match[0].length;
    }
    members.push({ name, text: text.slice(start, i), params });
    skipSpaces();
    if (i === text.length) return members;
    if (text[i] !== ',') return undefined;
    i++;
    skipSpaces();
    if (i === text.length) return undefined;
  }
}
