/**
 * Merges the proxy's `RateLimit` / `RateLimit-Policy` fields with those an upstream sent, so that
 * a client is never told it has more quota than either party grants:
 *
 * - Both are Structured Field Lists, so the two sides' members are combined into one list.
 * - A name that one side lists more than once is first reduced to its strictest member, at the
 *   place of the name's first member: in `RateLimit` the member with the lowest `r`, kept as sent
 *   (its own `t`: `r` and `t` describe one window, and pairing one member's `r` with another's `t`
 *   would state a window neither sent); on equal `r` the one with the longer `t`. In
 *   `RateLimit-Policy` members of one name and the same `w` are reduced to the lowest `q`;
 *   members of one name with different windows are different quotas and are all kept.
 * - A policy name on both sides is one policy: the member with the lower `r` (remaining) is kept,
 *   with its side's `RateLimit-Policy` members; on equal `r` the one with the longer `t`, and on a
 *   full tie the upstream's. An upstream policy with no `r` of its own loses to the proxy's, which
 *   has one.
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

/**
 * Adds the proxy's fields (`limitHeaders`, as `rateLimitHeaders` renders them) to an upstream
 * response's fields, in place, merged with any `RateLimit` fields the upstream sent.
 */
export function addRateLimitFields(
  responseHeaders: Record<string, string | string[]>,
  limitHeaders: Readonly<Record<string, string>>,
): void {
  const ourPolicy = limitHeaders['RateLimit-Policy'];
  if (ourPolicy === undefined) return;
  if (responseHeaders['ratelimit-policy'] === undefined && responseHeaders.ratelimit === undefined) {
    // The usual case: the upstream sent no RateLimit fields. Added without the merge, and
    // without `delete`, which would turn the header object into a slow dictionary for writeHead.
    responseHeaders['RateLimit-Policy'] = ourPolicy;
    const ourLimit = limitHeaders.RateLimit;
    if (ourLimit !== undefined) responseHeaders.RateLimit = ourLimit;
    return;
  }
  const merged = mergeRateLimitFields(
    { policy: ourPolicy, limit: limitHeaders.RateLimit },
    { policy: responseHeaders['ratelimit-policy'], limit: responseHeaders.ratelimit },
  );
  delete responseHeaders['ratelimit-policy'];
  delete responseHeaders.ratelimit;
  if (merged.policy !== undefined) responseHeaders['RateLimit-Policy'] = merged.policy;
  if (merged.limit !== undefined) responseHeaders.RateLimit = merged.limit;
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
  const theirLimit = strictestPerName(upstreamLimit);
  const theirPolicy = strictestPerWindow(upstreamPolicy);
  const myLimit = strictestPerName(ourLimit);
  const myPolicy = strictestPerWindow(ourPolicy);
  // Names where the proxy's entry is stricter: its members replace the upstream's.
  const oursWins = new Set<string>();
  const theirLimitByName = new Map(theirLimit.map((m) => [m.name, m]));
  const upstreamNames = new Set([...theirPolicy.map((m) => m.name), ...theirLimit.map((m) => m.name)]);
  for (const member of myLimit) {
    const theirs = theirLimitByName.get(member.name);
    if (theirs === undefined || stricterLimit(member, theirs)) oursWins.add(member.name);
  }
  // Each list on its own: the upstream may name a policy in one field only. Where ours wins, our
  // members stand in both fields, whichever field the upstream named it in; where the upstream's
  // is stricter, its members stand, and ours for that name are left out (one side's view of a
  // policy, not a mix of two).
  const mergeLists = (theirs: Member[], mine: Member[]): string | undefined => {
    const out: string[] = [];
    const mineByName = new Set(mine.map((m) => m.name));
    const theirNames = new Set<string>();
    for (const member of theirs) {
      const first = !theirNames.has(member.name);
      theirNames.add(member.name);
      if (!oursWins.has(member.name) || !mineByName.has(member.name)) {
        out.push(member.text);
      } else if (first) {
        // At the place of the name's first upstream member, once, however many the upstream sent.
        for (const replacement of mine) if (replacement.name === member.name) out.push(replacement.text);
      }
    }
    for (const member of mine) {
      if (theirNames.has(member.name)) continue;
      if (oursWins.has(member.name) || !upstreamNames.has(member.name)) out.push(member.text);
    }
    return out.length > 0 ? out.join(', ') : undefined;
  };
  return { policy: mergeLists(theirPolicy, myPolicy), limit: mergeLists(theirLimit, myLimit) };
}

/** One `RateLimit` member per name: the strictest (see the module comment), where the name first appears. */
function strictestPerName(members: Member[]): Member[] {
  const out: Member[] = [];
  const indexOf = new Map<string, number>();
  for (const member of members) {
    const index = indexOf.get(member.name);
    if (index === undefined) {
      indexOf.set(member.name, out.length);
      out.push(member);
    } else if (stricterLimit(member, out[index]!)) {
      out[index] = member;
    }
  }
  return out;
}

/** One `RateLimit-Policy` member per name and window: the lowest `q`, where that pair first appears. */
function strictestPerWindow(members: Member[]): Member[] {
  const out: Member[] = [];
  const indexOf = new Map<string, number>();
  for (const member of members) {
    const window = member.params.get('w');
    const windowNumber = Number(window);
    const key = `${member.name}\u0000${Number.isFinite(windowNumber) ? windowNumber : (window ?? '')}`;
    const index = indexOf.get(key);
    if (index === undefined) {
      indexOf.set(key, out.length);
      out.push(member);
    } else if (
      numberParam(member, 'q', Number.POSITIVE_INFINITY) <
      numberParam(out[index]!, 'q', Number.POSITIVE_INFINITY)
    ) {
      out[index] = member;
    }
  }
  return out;
}

/** Lower `r`, or equal `r` and longer `t`. A missing `r` counts as unlimited, a missing `t` as 0. */
function stricterLimit(a: Member, b: Member): boolean {
  const remainingA = numberParam(a, 'r', Number.POSITIVE_INFINITY);
  const remainingB = numberParam(b, 'r', Number.POSITIVE_INFINITY);
  if (remainingA !== remainingB) return remainingA < remainingB;
  return numberParam(a, 't', 0) > numberParam(b, 't', 0);
}

function numberParam(member: Member, name: string, missing: number): number {
  const text = member.params.get(name);
  const value = text === undefined ? Number.NaN : Number(text);
  return Number.isFinite(value) ? value : missing;
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
