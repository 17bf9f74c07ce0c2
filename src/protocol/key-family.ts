/**
 * A bucket key's family, for logs about many keys at once: the key up to its first `=` (else its
 * first `:`) and `*`. `api:caller=acme` and `api:caller=zed` are `api:caller=*`, `payments:charge`
 * is `payments:*`, `anon:2001:db8::/64` is `anon:*`; a key with neither is its own family. It reads
 * like the template rule that would cover the keys, which is what a reader of such a log line
 * has to write.
 */
export function keyFamily(key: string): string {
  const equals = key.indexOf('=');
  const end = equals !== -1 ? equals : key.indexOf(':');
  return end === -1 ? key : `${key.slice(0, end + 1)}*`;
}
