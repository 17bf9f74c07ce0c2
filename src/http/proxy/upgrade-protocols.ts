/**
 * Which upgrades the proxy tunnels. An upgraded connection is decided once, as its upgrade
 * request, and then carries whatever its protocol carries: a WebSocket carries messages for one
 * endpoint, but `h2c` (HTTP/2 over cleartext) carries any number of HTTP requests, which would
 * reach the upstream without a bucket deciding them. So only the protocols in
 * `server.upgradeProtocols` are tunnelled, and every other upgrade is refused before anything is
 * decided or forwarded. A protocol is compared without letter case; a listed `name` also admits
 * `name/version`, a listed `name/version` only itself.
 */

/** Longest protocol a refusal quotes back (the field is the client's). */
const QUOTED_MAX = 64;

/** The members of an `Upgrade` field (RFC 9110 §7.8: a comma-separated list), in lower case. */
export function upgradeMembers(field: string | undefined): string[] {
  if (field === undefined) return [];
  const members: string[] = [];
  for (const member of field.split(',')) {
    const protocol = member.trim().toLowerCase();
    if (protocol !== '') members.push(protocol);
  }
  return members;
}

function tunnelled(protocol: string, tunnels: readonly string[]): boolean {
  for (const allowed of tunnels) {
    if (protocol === allowed) return true;
    if (!allowed.includes('/') && protocol.startsWith(`${allowed}/`)) return true;
  }
  return false;
}

/**
 * The first protocol the request asks for that the proxy does not tunnel, or undefined when it
 * tunnels them all. An empty field is refused as `""`: it names nothing that could be tunnelled.
 */
export function refusedUpgrade(requested: readonly string[], tunnels: readonly string[]): string | undefined {
  if (requested.length === 0) return '';
  for (const protocol of requested) if (!tunnelled(protocol, tunnels)) return protocol;
  return undefined;
}

/** The 501 body of a refused upgrade: a stable `error`, the protocol refused, what is tunnelled. */
export function upgradeRefusalBody(
  protocol: string,
  tunnels: readonly string[],
): { error: 'upgrade_refused'; message: string; upgrade: string; tunnels: readonly string[] } {
  const quoted = protocol.length > QUOTED_MAX ? `${protocol.slice(0, QUOTED_MAX)}…` : protocol;
  const listed = tunnels.length === 0 ? ' none' : `: ${tunnels.join(', ')}`;
  return {
    error: 'upgrade_refused',
    message: `this proxy does not tunnel the ${quoted === '' ? '""' : quoted} protocol (it tunnels${listed})`,
    upgrade: quoted,
    tunnels,
  };
}

/**
 * Whether an upstream's `101` switched to protocols the client asked for (RFC 9110 §7.8: a server
 * must not switch to one it was not offered): `Upgrade` present, and each member one of `requested`.
 */
export function switchedAsRequested(
  answered: string | string[] | undefined,
  requested: readonly string[],
): boolean {
  const members = upgradeMembers(Array.isArray(answered) ? answered.join(',') : answered);
  return members.length > 0 && members.every((protocol) => requested.includes(protocol));
}
