/**
 * Builds `${prefix}:{${key}}:${suffix}`. Every key of one limiter call shares the `{hash tag}`, so
 * Redis Cluster puts them in one slot and a script may touch them all.
 *
 * Redis takes the tag from the first `{` to the first `}` after it, so a raw `}` or `{` inside the
 * caller's key could move or empty the tag (a key starting with `}` gives `{}`, and then each key
 * hashes whole and lands in a different slot). Braces and `%` are therefore percent-encoded; the
 * encoding is injective, so distinct caller keys stay distinct Redis keys.
 */
export function redisKey(prefix: string, key: string, suffix: string): string {
  return `${prefix}:{${encodeTag(key)}}:${suffix}`;
}

function encodeTag(key: string): string {
  return /[{}%]/.test(key)
    ? key.replace(/[{}%]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
    : key;
}
