import { createHash, timingSafeEqual } from 'node:crypto';

/** Shortest admin token accepted: a guessable token on a page that changes limits is worse than none. */
export const MIN_ADMIN_TOKEN_LENGTH = 16;

export type BearerCheck = 'ok' | 'missing' | 'invalid';

/**
 * Checks an `Authorization: Bearer <token>` header against the configured token in constant time:
 * both sides are hashed first, so neither the token's content nor its length shows in the timing.
 */
export function checkBearer(header: string | undefined, expected: string): BearerCheck {
  if (header === undefined || header.trim() === '') return 'missing';
  const match = /^Bearer[ \t]+(\S+)\s*$/i.exec(header);
  if (!match) return 'invalid';
  return tokensEqual(match[1]!, expected) ? 'ok' : 'invalid';
}

export function tokensEqual(given: string, expected: string): boolean {
  const a = createHash('sha256').update(given, 'utf8').digest();
  const b = createHash('sha256').update(expected, 'utf8').digest();
  return timingSafeEqual(a, b);
}
