import { MAX_ACKNOWLEDGED_BY_BYTES } from './report-bounds.js';

/**
 * A reply's `responder_id` as the sender's next report names it in `acknowledged_by`. An id a
 * broken or hostile parent sent longer than receivers take is not passed on: every later report
 * would be refused with it, and the sender lost to its aggregators for good.
 */
export function acknowledgingId(responderId: unknown): string {
  if (typeof responderId !== 'string' || responderId.length > MAX_ACKNOWLEDGED_BY_BYTES) return '';
  return Buffer.byteLength(responderId, 'utf8') <= MAX_ACKNOWLEDGED_BY_BYTES ? responderId : '';
}
