/**
 * Which of two directives for the same bucket wins. A controller's epoch is its start identity and
 * a newer epoch always wins, whatever its version (a restarted controller starts counting again);
 * within an epoch the higher version wins. Equal (epoch, version) is the same computation relayed
 * twice and is not newer: re-applying it must not extend its TTL, or an aggregator relaying a
 * cached directive from a dead controller would keep it fresh forever.
 */
export function isNewerDirective(
  epoch: bigint,
  version: bigint,
  heldEpoch: bigint,
  heldVersion: bigint,
): boolean {
  if (epoch !== heldEpoch) return epoch > heldEpoch;
  return version > heldVersion;
}
