import { Buffer } from 'node:buffer';
import type { BucketId } from '../gen/envoy/service/rate_limit_quota/v3/rlqs_pb.js';
import { type CompiledDomain, type DescriptorMatch, findNode, matchDescriptor } from './descriptor-rules.js';

/**
 * RLQS names a quota bucket by an unordered map (`BucketId`, `{a: A, b: B}` is `{b: B, a: A}`);
 * the limits file names limits by ordered descriptor paths. A BucketId takes the rule whose path
 * uses each of its pairs once, in some order, found level by level as a descriptor is (exact value,
 * then wildcard, then key-only). Its bucket key is then the one `spillway rls` gives the same
 * entries in that order, so RLQS and RLS usage of one rule count together.
 */

/** Pairs per BucketId: Envoy's bucket_id_builder makes a handful. */
export const MAX_BUCKET_ID_PAIRS = 16;
/** UTF-8 bytes of one key or value. */
export const MAX_BUCKET_ID_TEXT_BYTES = 16 * 1024;
/** Paths tried per BucketId: bounds the search whatever the pairs (16 pairs could order 16! ways). */
const MAX_SEARCH_STEPS = 10_000;

export type BucketIdProblem = string;

/** The pairs sorted by key, or why the BucketId is refused (the rules of rlqs.proto: at least one pair, none empty). */
export function bucketIdPairs(
  bucketId: BucketId | undefined,
): { pairs: [string, string][] } | { problem: BucketIdProblem } {
  if (bucketId === undefined) return { problem: 'bucket_id is required' };
  const pairs = Object.entries(bucketId.bucket);
  if (pairs.length === 0) return { problem: 'bucket_id has no pairs' };
  if (pairs.length > MAX_BUCKET_ID_PAIRS) {
    return { problem: `bucket_id has ${pairs.length} pairs, more than the ${MAX_BUCKET_ID_PAIRS} allowed` };
  }
  for (const [key, value] of pairs) {
    if (key === '' || value === '') return { problem: 'bucket_id keys and values must not be empty' };
    if (tooLong(key) || tooLong(value)) {
      return { problem: `a bucket_id key or value is longer than ${MAX_BUCKET_ID_TEXT_BYTES} bytes` };
    }
  }
  pairs.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return { pairs };
}

/** One string per BucketId whatever the order of its pairs. */
export function canonicalBucketId(pairs: readonly [string, string][]): string {
  return JSON.stringify(pairs);
}

/** The rule (and bucket key) for a BucketId's pairs, or undefined when no path uses them all. */
export function matchBucketId(
  domain: CompiledDomain,
  pairs: readonly [string, string][],
): DescriptorMatch | undefined {
  const used = new Array<boolean>(pairs.length).fill(false);
  const order: { key: string; value: string }[] = [];
  let steps = 0;
  const search = (level: CompiledDomain['root']): DescriptorMatch | undefined => {
    for (let i = 0; i < pairs.length; i++) {
      if (used[i] || ++steps > MAX_SEARCH_STEPS) continue;
      const [key, value] = pairs[i]!;
      const node = findNode(level, key, value);
      if (node === undefined) continue;
      used[i] = true;
      order.push({ key, value });
      const found = order.length === pairs.length ? matchDescriptor(domain, order) : search(node.children);
      if (found !== undefined) return found;
      order.pop();
      used[i] = false;
    }
    return undefined;
  };
  return search(domain.root);
}

function tooLong(text: string): boolean {
  return (
    text.length > MAX_BUCKET_ID_TEXT_BYTES ||
    (text.length * 3 > MAX_BUCKET_ID_TEXT_BYTES && Buffer.byteLength(text) > MAX_BUCKET_ID_TEXT_BYTES)
  );
}
