import { type ChildProcess, execFileSync, spawnSync } from 'node:child_process';
import type { TestContext } from 'node:test';
import { type SpillwayProcess, startSpillway } from '../integration/spillway-process.js';

/**
 * Test helper: real network partitions between the tiers of a fleet, with Linux network namespaces.
 * A tier runs in its own namespace (`ip netns exec NS node …`), joined to the root namespace by veth
 * pairs, each pair its own /30 out of 198.18.0.0/15 (RFC 2544's range for benchmark networks, not used on real ones).
 *
 * A partition is one of:
 * - `drop`: both ends of the link get a permanent neighbour entry pointing at a MAC that is not the
 *   peer's. Packets still leave the sender without error and the receiver discards them (addressed
 *   to another host): they vanish, as behind a failed switch or a firewall's drop rule. It needs
 *   only `ip`; this kernel has no netem, and nft/iptables may not be installed.
 * - `link-down`: the namespace end of the link is set down, as when the tier's interface goes
 *   down: the tier's own sends fail at once (no route; the namespace has no default route, so
 *   nothing leaks elsewhere), and the root end, without carrier, silently drops what it sends.
 * Healing undoes exactly that (the neighbour entries are deleted and resolved again by ARP; the
 * link is set up and its connected route returns).
 *
 * Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and util-linux's setpriv. Names carry
 * this process's pid, so concurrent runs do not clash. Everything is removed on close(), on process
 * exit and on SIGINT / SIGTERM; processes started here get SIGKILL when this process dies, however
 * it dies; and a later run removes the namespaces and veth pairs of a run that was killed outright.
 */
export type PartitionMode = 'drop' | 'link-down';

export interface VethLink {
  /** The namespace holding one end; the other end is in the root namespace. */
  readonly namespace: string;
  readonly rootDevice: string;
  readonly namespaceDevice: string;
  readonly rootAddress: string;
  readonly namespaceAddress: string;
  /** `up`, or the partition applied. */
  readonly state: 'up' | PartitionMode;
}

const NAME_PREFIX = 'spwtest';
/** 198.18.0.0/15 as blocks of 8 /30 links (a /27) per lab: 4096 blocks. */
const RANGE_BASE = ((198 << 24) | (18 << 16)) >>> 0;
const BLOCK_COUNT = 4096;
const LINKS_PER_BLOCK = 8;
/** Locally administered, never assigned to a device here: frames to it are for "another host". */
const NOWHERE_MAC = '02:00:5e:00:00:01';

let labSequence = 0;
const openLabs = new Set<NetnsLab>();
let exitHooksInstalled = false;

function ip(args: string[]): string {
  try {
    return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (error) {
    const stderr = (error as { stderr?: string }).stderr?.trim();
    throw new Error(`ip ${args.join(' ')} failed${stderr ? `: ${stderr}` : ''}`);
  }
}

/** Each end of a link: the `ip` arguments that reach its namespace, its device and its peer's address. */
function ends(link: VethLink): { ipPrefix: string[]; device: string; peer: string }[] {
  return [
    { ipPrefix: [], device: link.rootDevice, peer: link.namespaceAddress },
    { ipPrefix: ['-n', link.namespace], device: link.namespaceDevice, peer: link.rootAddress },
  ];
}

function formatAddress(value: number): string {
  return [value >>> 24, (value >>> 16) & 255, (value >>> 8) & 255, value & 255].join('.');
}

function parseAddress(text: string): number {
  const [a, b, c, d] = text.split('.').map(Number);
  return ((a! << 24) | (b! << 16) | (c! << 8) | d!) >>> 0;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** IPv4 prefixes in use on this machine (every route table), to keep a lab's block clear of them. */
function prefixesInUse(): { base: number; size: number }[] {
  const prefixes: { base: number; size: number }[] = [];
  for (const line of ip(['-4', 'route', 'show', 'table', 'all']).split('\n')) {
    // The destination is the first address on the line, after an optional type (local, broadcast…).
    const match = /(?:^|\s)(\d+\.\d+\.\d+\.\d+)(?:\/(\d+))?(?:\s|$)/.exec(line);
    if (!match || line.startsWith('default')) continue;
    const bits = match[2] === undefined ? 32 : Number(match[2]);
    const size = 2 ** (32 - bits);
    prefixes.push({ base: parseAddress(match[1]!) - (parseAddress(match[1]!) % size), size });
  }
  return prefixes;
}

/**
 * Removes what runs whose process is gone left behind: their namespaces, and root ends of veth
 * pairs whose namespace is kept alive by the kernel a while longer (orphaned TCP sockets still
 * retransmitting into a partition).
 */
function sweepStale(): void {
  for (const line of ip(['netns', 'list']).split('\n')) {
    const match = new RegExp(`^(${NAME_PREFIX}-(\\d+)-\\S+)`).exec(line);
    if (match && !isAlive(Number(match[2]))) spawnSync('ip', ['netns', 'del', match[1]!]);
  }
  for (const line of ip(['-o', 'link', 'show', 'type', 'veth']).split('\n')) {
    const match = /^\d+: (sw([0-9a-z]+)-[0-9a-z]+l\d+r)@/.exec(line);
    if (match && !isAlive(Number.parseInt(match[2]!, 36))) spawnSync('ip', ['link', 'del', match[1]!]);
  }
}

/**
 * Why network namespaces cannot be used here, or undefined when they can: Linux, root, iproute2,
 * and creating a namespace with a veth pair into it succeeds (it is created and removed).
 */
export function netnsUnavailable(): string | undefined {
  if (process.platform !== 'linux') return `network namespaces need Linux (this is ${process.platform})`;
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  if (spawnSync('ip', ['-V']).error) return '`ip` (iproute2) is not installed';
  if (spawnSync('setpriv', ['--version']).error) return '`setpriv` (util-linux) is not installed';
  const probe = new NetnsLab();
  try {
    const namespace = probe.addNamespace('probe');
    probe.addLink(namespace);
    return undefined;
  } catch (error) {
    return `cannot create a network namespace with a veth pair: ${(error as Error).message}`;
  } finally {
    probe.closeSync();
  }
}

/**
 * Skip (or, under CI=true, fail) when network namespaces are unusable. CI runs as root and must
 * prove the real-partition guarantees, never skip them silently. Returns true when the test may run.
 */
export function requireNetns(t: TestContext): boolean {
  const reason = netnsUnavailable();
  if (reason === undefined) return true;
  if (process.env.CI === 'true') throw new Error(`network namespaces are required under CI: ${reason}`);
  t.skip(reason);
  return false;
}

function installExitHooks(): void {
  if (exitHooksInstalled) return;
  exitHooksInstalled = true;
  process.on('exit', () => {
    for (const lab of openLabs) lab.closeSync();
  });
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      for (const lab of openLabs) lab.closeSync();
      process.kill(process.pid, signal);
    });
  }
}

export class NetnsLab {
  private readonly sequence = labSequence++;
  /** `spwtest-<pid>-<n>`: the pid lets a later run tell a dead run's leftovers from a live one's. */
  readonly prefix = `${NAME_PREFIX}-${process.pid}-${this.sequence}`;
  private readonly devicePrefix: string;
  private readonly namespaces: string[] = [];
  private readonly links: (VethLink & { state: 'up' | PartitionMode })[] = [];
  private readonly children = new Set<ChildProcess>();
  private blockBase: number | undefined;

  constructor() {
    // Interface names have at most 15 characters: `sw<pid>-<lab>` in base 36, then `l<link><side>`.
    this.devicePrefix = `sw${process.pid.toString(36)}-${this.sequence.toString(36)}`;
    installExitHooks();
    openLabs.add(this);
  }

  /** Creates a namespace with its loopback up; returns its name. */
  addNamespace(role: string): string {
    if (this.namespaces.length === 0) sweepStale();
    const name = `${this.prefix}-${role}`;
    ip(['netns', 'add', name]);
    this.namespaces.push(name);
    ip(['-n', name, 'link', 'set', 'lo', 'up']);
    return name;
  }

  /** A veth pair from the root namespace into `namespace`, both ends up with their /30 addresses. */
  addLink(namespace: string): VethLink {
    if (!this.namespaces.includes(namespace)) throw new Error(`${namespace} is not a namespace of this lab`);
    if (this.links.length >= LINKS_PER_BLOCK) throw new Error(`a lab has at most ${LINKS_PER_BLOCK} links`);
    const subnet = this.block() + 4 * this.links.length;
    const index = this.links.length;
    const link = {
      namespace,
      rootDevice: `${this.devicePrefix}l${index}r`,
      namespaceDevice: `${this.devicePrefix}l${index}n`,
      rootAddress: formatAddress(subnet + 1),
      namespaceAddress: formatAddress(subnet + 2),
      state: 'up' as 'up' | PartitionMode,
    };
    ip(['link', 'add', link.rootDevice, 'type', 'veth', 'peer', 'name', link.namespaceDevice]);
    this.links.push(link);
    ip(['link', 'set', link.namespaceDevice, 'netns', namespace]);
    ip(['addr', 'add', `${link.rootAddress}/30`, 'dev', link.rootDevice]);
    ip(['-n', namespace, 'addr', 'add', `${link.namespaceAddress}/30`, 'dev', link.namespaceDevice]);
    ip(['link', 'set', link.rootDevice, 'up']);
    ip(['-n', namespace, 'link', 'set', link.namespaceDevice, 'up']);
    return link;
  }

  partition(link: VethLink, mode: PartitionMode): void {
    const owned = this.owned(link);
    if (owned.state !== 'up') throw new Error(`${link.rootDevice} is already partitioned (${owned.state})`);
    if (mode === 'drop') {
      for (const end of ends(link)) {
        ip([
          ...end.ipPrefix,
          'neigh',
          'replace',
          end.peer,
          'lladdr',
          NOWHERE_MAC,
          'dev',
          end.device,
          'nud',
          'permanent',
        ]);
      }
    } else {
      ip(['-n', link.namespace, 'link', 'set', link.namespaceDevice, 'down']);
    }
    owned.state = mode;
  }

  heal(link: VethLink): void {
    const owned = this.owned(link);
    if (owned.state === 'drop') {
      for (const end of ends(link)) ip([...end.ipPrefix, 'neigh', 'del', end.peer, 'dev', end.device]);
    } else if (owned.state === 'link-down') {
      ip(['-n', link.namespace, 'link', 'set', link.namespaceDevice, 'up']);
    }
    owned.state = 'up';
  }

  /**
   * The TCP sockets of `namespace` (the root namespace when undefined; `ss -tan` there) whose peer
   * is `peerAddress` (any port), e.g. to see whether a tier opened new connections through a
   * partition. States as `ss` names them (`ESTAB`, `SYN-SENT`, `FIN-WAIT-1`, ...).
   */
  tcpSockets(
    namespace: string | undefined,
    peerAddress: string,
  ): { state: string; local: string; peer: string }[] {
    if (namespace !== undefined && !this.namespaces.includes(namespace))
      throw new Error(`${namespace} is not a namespace of this lab`);
    const command =
      namespace === undefined ? ['ss', '-Htan'] : ['ip', 'netns', 'exec', namespace, 'ss', '-Htan'];
    const out = execFileSync(command[0]!, command.slice(1), {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const sockets: { state: string; local: string; peer: string }[] = [];
    for (const line of out.split('\n')) {
      const [state, , , local, peer] = line.trim().split(/\s+/);
      if (state && local && peer && peer.slice(0, peer.lastIndexOf(':')) === peerAddress)
        sockets.push({ state, local, peer });
    }
    return sockets;
  }

  /**
   * Runs `spillway <args>` from source inside `namespace` (the root namespace when undefined) and
   * resolves once it logs `listening` (the addresses it bound), like startSpillway in
   * test/integration/spillway-process.ts. The process gets SIGKILL when this one dies, however it
   * dies (setpriv's parent-death signal): no tier outlives a killed test.
   */
  async startSpillway(
    namespace: string | undefined,
    name: string,
    args: string[],
    { timeoutMs = 30_000 } = {},
  ): Promise<SpillwayProcess> {
    const prefix = [
      ...(namespace === undefined ? [] : ['ip', 'netns', 'exec', namespace]),
      'setpriv',
      '--pdeathsig',
      'KILL',
      '--',
    ];
    const started = await startSpillway(name, args, { timeoutMs, prefix });
    this.children.add(started.child);
    void started.exited.then(() => this.children.delete(started.child));
    return started;
  }

  /**
   * Kills what is still running inside (the caller should have stopped its processes gracefully
   * first), then deletes the namespaces, which deletes their veth pairs.
   */
  async close(): Promise<void> {
    const exits = [...this.children].map((child) => new Promise((resolve) => child.once('exit', resolve)));
    for (const child of this.children) child.kill('SIGKILL');
    await Promise.all(exits);
    this.closeSync();
  }

  /** For exit paths that cannot wait: SIGKILL the children, delete the namespaces. Idempotent. */
  closeSync(): void {
    for (const child of this.children) child.kill('SIGKILL');
    for (const namespace of this.namespaces.splice(0)) spawnSync('ip', ['netns', 'del', namespace]);
    // A root end whose namespace is still held by a process outlives `netns del`; remove it too.
    for (const link of this.links.splice(0)) {
      spawnSync('ip', ['link', 'del', link.rootDevice], { stdio: 'ignore' });
    }
    openLabs.delete(this);
  }

  private owned(link: VethLink): VethLink & { state: 'up' | PartitionMode } {
    const owned = this.links.find((l) => l.rootDevice === link.rootDevice);
    if (!owned) throw new Error(`${link.rootDevice} is not a link of this lab`);
    return owned;
  }

  /** This lab's /27 of 198.18.0.0/15: chosen by pid, moved past any block already routed here. */
  private block(): number {
    if (this.blockBase !== undefined) return this.blockBase;
    const size = 4 * LINKS_PER_BLOCK;
    const inUse = prefixesInUse();
    // Runs with neighbouring pids start 7 blocks apart, room for a few labs each.
    const first = (process.pid * 7 + this.sequence) % BLOCK_COUNT;
    for (let step = 0; step < BLOCK_COUNT; step++) {
      const base = RANGE_BASE + ((first + step) % BLOCK_COUNT) * size;
      const clashes = inUse.some((p) => p.base < base + size && base < p.base + p.size);
      if (!clashes) {
        this.blockBase = base;
        return base;
      }
    }
    throw new Error('no free /27 left in 198.18.0.0/15');
  }
}
