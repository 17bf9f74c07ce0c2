/**
 * How late one reporter's reports arrive compared with its usual, so that a report that spent
 * seconds in a TCP retransmission queue is not counted as news.
 *
 * The case it exists for: a host's report to aggregator A is stuck in a partition, its client gives
 * up and the host moves to aggregator B. When the path heals, TCP delivers the old report to A,
 * which would count the host again, next to B, for a whole host grace. A cannot tell that from
 * the report's sequence (A never saw the newer ones), only from its age. What it costs:
 * docs/reliability.md, "Reports that arrive late".
 *
 * Age without synchronised clocks: `offset = arrival (receiver's clock) - window end (sender's
 * clock)` is the clocks' difference plus the transit time. Over the last few accepted reports the
 * smallest offset is the clocks' difference plus the quickest transit, so a report's lateness is
 * its offset minus that smallest one; the difference between the clocks cancels out. The window
 * slides so that clock drift (100 ppm is 6 ms a minute) never builds up.
 *
 * A sender whose clock steps back looks late too, but it keeps reporting: two reports in a row with
 * the same offset (within a quarter interval) are a new normal, not a delay, and reset the window;
 * reports drained from a queue at once have offsets a whole interval apart and stay late. So a
 * clock step costs one report, and a late bunch costs nothing it should not.
 *
 * A sender's first report to a receiver has no usual of its own. It is judged against the other
 * senders' (`fleetUsualOffsetMs`), with one more interval of slack for the clocks' differences: a
 * host cut off from every aggregator leaves a stuck report at each one it tried, and those that
 * never saw it would otherwise count it. A sender whose clock is further off than that loses its
 * first report, and its second (agreeing with the first) sets its own usual.
 */
export class ReportArrivals {
  /** Accepted reports whose offsets make the reporter's usual. */
  static readonly window = 8;
  readonly #offsets: number[] = [];
  #lastOffsetMs: number | undefined;

  /**
   * Whether a report arriving `offsetMs` after its window's end (see above) is later than
   * `lateAfterMs` against this reporter's usual. Remembers the offset either way.
   */
  isLate(offsetMs: number, lateAfterMs: number, intervalMs: number, fleetUsualMs?: number): boolean {
    const previous = this.#lastOffsetMs;
    this.#lastOffsetMs = offsetMs;
    const own = this.usualOffsetMs;
    const usual = own ?? fleetUsualMs;
    const slackMs = own === undefined ? lateAfterMs + intervalMs : lateAfterMs;
    if (usual === undefined || offsetMs - usual <= slackMs) {
      this.#accept(offsetMs);
      return false;
    }
    if (previous !== undefined && Math.abs(offsetMs - previous) <= intervalMs / 4) {
      // The sender's clock moved: start over from here.
      this.#offsets.length = 0;
      this.#accept(offsetMs);
      return false;
    }
    return true;
  }

  /** The smallest offset of the recent accepted reports; undefined before the first. */
  get usualOffsetMs(): number | undefined {
    if (this.#offsets.length === 0) return undefined;
    let min = this.#offsets[0]!;
    for (const offset of this.#offsets) if (offset < min) min = offset;
    return min;
  }

  #accept(offsetMs: number): void {
    if (this.#offsets.length >= ReportArrivals.window) this.#offsets.shift();
    this.#offsets.push(offsetMs);
  }
}

/** Senders sampled for `fleetUsualOffsetMs`: enough for a median, cheap for each new sender. */
const FLEET_SAMPLE = 63;

/**
 * The median usual offset of up to 63 senders (the first in `senders`' order), the prior for a
 * sender's first report; undefined when none has one.
 */
export function fleetUsualOffsetMs(senders: Iterable<{ arrivals: ReportArrivals }>): number | undefined {
  const usuals: number[] = [];
  for (const sender of senders) {
    const usual = sender.arrivals.usualOffsetMs;
    if (usual !== undefined) usuals.push(usual);
    if (usuals.length >= FLEET_SAMPLE) break;
  }
  if (usuals.length === 0) return undefined;
  usuals.sort((a, b) => a - b);
  return usuals[Math.floor(usuals.length / 2)];
}

/**
 * The arrivals of reporters whose state expired, so a report that turns up after its sender's
 * state was dropped is still judged against the sender's usual. Bounded: the oldest entry goes
 * first.
 */
export class ExpiredReporterArrivals {
  readonly #entries = new Map<string, ReportArrivals>();
  readonly #max: number;

  constructor(max: number) {
    this.#max = max;
  }

  remember(key: string, arrivals: ReportArrivals): void {
    this.#entries.delete(key);
    this.#entries.set(key, arrivals);
    if (this.#entries.size > this.#max) {
      const oldest = this.#entries.keys().next();
      if (!oldest.done) this.#entries.delete(oldest.value);
    }
  }

  /** The reporter's arrivals if it expired (and forgets them here), else a fresh record. */
  take(key: string): ReportArrivals {
    const arrivals = this.#entries.get(key);
    if (arrivals === undefined) return new ReportArrivals();
    this.#entries.delete(key);
    return arrivals;
  }

  get size(): number {
    return this.#entries.size;
  }
}

/** What a receiver knows of a sender it has state for (a host at an aggregator, a child at the controller). */
export interface ReportSender {
  sequences: { has(sequence: bigint, windowEndMs: bigint): boolean; readonly last: bigint };
  lastWindowEndMs: bigint;
  arrivals: ReportArrivals;
}

/**
 * Whether a report is late, so that a receiver must leave it out of its sums: not a retry of one
 * already counted (that is a duplicate, answered as before), and either older than the last one
 * applied from its sender or late against the sender's usual arrival.
 *
 * `sender` is undefined when the receiver has no state for it (new, or expired: then `arrivals`
 * comes from `ExpiredReporterArrivals`); `senders` are the others, whose median usual judges a first report.
 * Remembers the report's arrival in `arrivals` either way.
 */
export function isLateReport(
  sender: ReportSender | undefined,
  arrivals: ReportArrivals,
  report: { sequence: bigint; windowEndMs: bigint },
  nowMs: number,
  intervalMs: number,
  senders: Iterable<{ arrivals: ReportArrivals }>,
): boolean {
  if (sender?.sequences.has(report.sequence, report.windowEndMs)) return false;
  if (isOlderThanLast(sender, report)) return true;
  return arrivals.isLate(
    nowMs - Number(report.windowEndMs),
    // A sender gives up on a report after its deadline (half an interval by default) and carries
    // its counts into the next one, maybe to another receiver: news no longer.
    intervalMs,
    intervalMs,
    arrivals.usualOffsetMs === undefined ? fleetUsualOffsetMs(senders) : undefined,
  );
}

/**
 * Whether `report` is older than the last one applied from its sender: a sequence a few behind and
 * an earlier window. A report held back on an old connection can arrive after a newer one sent on a
 * fresh connection; applied, it would replace the newer usage with older. Both tests, because a
 * restarted sender starts its sequence over (its window is newer) and a sender whose clock stepped
 * back has older windows (its sequence is newer).
 */
export function isOlderThanLast(
  sender: { sequences: { readonly last: bigint }; lastWindowEndMs: bigint } | undefined,
  report: { sequence: bigint; windowEndMs: bigint },
): boolean {
  return (
    sender !== undefined &&
    report.sequence < sender.sequences.last &&
    // A few behind: a held-back report. Far behind is a sender that started over (restarted with
    // the same id), whose clock may well be behind the old process's last window.
    sender.sequences.last - report.sequence <= OLDER_REPORT_MAX_GAP &&
    report.windowEndMs < sender.lastWindowEndMs
  );
}

/**
 * How many sequences behind the last applied a report may be and still be taken for a held-back
 * one: the gRPC client replaces a stuck connection after 2 reports time out, so a few at most.
 */
const OLDER_REPORT_MAX_GAP = 4n;
