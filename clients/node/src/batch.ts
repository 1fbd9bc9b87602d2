// Batching (docs/clients.md#batching-optional), as clients/go/batch.go does it.
//
// A credit is units already paid for in Redis (one QUANTITY k call) and handed out locally.
// Window credits are used and refunded only inside the window they were paid in (a unit paid
// in one window must not be used or given back in the next, or that window would admit more
// than its limit); GCRA leftovers are refunded only while the bucket cannot have drained past
// them (before sent + k·T), so a refund never gives back more than was really unused.
//
// Times are performance.now() milliseconds (monotonic).

import { performance } from "node:perf_hooks";
import { makeDecision, type Decision } from "./decision.js";
import { GCRA, Lease, MAX_SECONDS, Window, type Limit } from "./limits.js";

/** Units paid for in Redis and not yet handed out. */
export interface Credit {
  /** The key as sent (prefix included). */
  key: string;
  units: bigint;
  useUntil: number;
  refundUntil: number;
  remainingSeen: number;
}

interface Hint {
  remaining: number;
  at: number;
}

const MAX_MS = MAX_SECONDS * 1000;

export function now(): number {
  return performance.now();
}

/** One limiter's batch credits, keyed like the deny cache (key and limit). */
export class Batcher {
  private readonly credits = new Map<string, Credit>();
  /** Replaced credits still to refund. */
  private pending: Credit[] = [];
  private readonly hints = new Map<string, Hint>();
  private rttMs = 1;
  /** @internal The sweeper's timer while credits are held. */
  timer: NodeJS.Timeout | undefined;

  constructor(
    readonly k: bigint,
    readonly holdMs: number,
  ) {}

  /** Keeps a moving average of the batched calls' round trips. */
  observeRTT(sent: number): void {
    this.rttMs = (this.rttMs / 5) * 4 + (now() - sent) / 5;
  }

  /** The safety gap kept before a window boundary or a GCRA refund deadline. */
  margin(): number {
    return 5 + 3 * this.rttMs;
  }

  /** Hands out cost units from a live credit; the credit after the take, if one held them. */
  take(ck: string, cost: bigint, at = now()): Credit | undefined {
    const c = this.credits.get(ck);
    if (c === undefined || at >= c.useUntil || c.units < cost) return undefined;
    c.units -= cost;
    return { ...c };
  }

  /**
   * Stores a new credit. A live one it meets (another call's batch of the same key and
   * limit, taken at about the same time) is merged into it with the earlier of the two
   * deadlines each (before both, both units may be used and refunded); one past its use time
   * that still holds units is kept for refunding.
   */
  put(ck: string, c: Credit, at = now()): void {
    const old = this.credits.get(ck);
    if (old !== undefined && old.units > 0n) {
      if (at < old.useUntil) {
        c.units += old.units;
        c.remainingSeen = Math.min(c.remainingSeen, old.remainingSeen);
        c.useUntil = Math.min(c.useUntil, old.useUntil);
        c.refundUntil = Math.min(c.refundUntil, old.refundUntil);
      } else this.pending.push(old);
    }
    this.credits.set(ck, c);
  }

  /** Removes and returns the credits past their use time that still hold units (all with everything), and the replaced ones. */
  expired(at: number, everything: boolean): Credit[] {
    const out = this.pending;
    this.pending = [];
    for (const [ck, c] of this.credits) {
      if (everything || at >= c.useUntil) {
        if (c.units > 0n) out.push(c);
        this.credits.delete(ck);
      }
    }
    return out;
  }

  empty(): boolean {
    return this.credits.size === 0 && this.pending.length === 0;
  }

  noteRemaining(ck: string, remaining: number): void {
    if (this.hints.size > 10_000) this.hints.clear();
    this.hints.set(ck, { remaining, at: now() });
  }

  /**
   * How many units one batched call of limit takes for cost (0: do not batch). LOG is not
   * batched (a refund gives back the newest entries, not ours), nor leases.
   */
  size(limit: Limit, cost: bigint): bigint {
    if (limit instanceof Lease || (limit instanceof Window && limit.algorithm === "LOG")) return 0n;
    const k = this.k < limit.capacity ? this.k : limit.capacity;
    return cost < k ? k : 0n;
  }

  /**
   * How many units to ask for: k, unless the last reply for this key (plus what GCRA refilled
   * since) says fewer are there, so that a key running at its limit costs one call per
   * admission, not two.
   */
  firstTake(ck: string, limit: Limit, cost: bigint, k: bigint): bigint {
    const h = this.hints.get(ck);
    if (h === undefined) return k;
    let remaining = BigInt(Math.max(0, Math.trunc(h.remaining)));
    const elapsedMs = now() - h.at;
    if (limit instanceof GCRA) {
      if (elapsedMs > 0) remaining += BigInt(Math.floor(elapsedMs * 1e6)) / limit.intervalNs;
    } else if (elapsedMs > this.holdMs) return k;
    const want = k < remaining ? k : remaining;
    return want > cost ? want : cost;
  }

  /**
   * [use until, refund until] for taken units paid at sent.
   *
   * GCRA: use within the hold; refund only before sent + taken·T − margin. FIXED: the window
   * ends resetAfterMs after Redis decided (≥ sent). SLIDING: after a write the key is idle at
   * the end of the next window, so the current one ends resetAfterMs − window after Redis
   * decided.
   */
  deadlines(limit: Limit, taken: bigint, sent: number, resetAfterMs: number): [number, number] {
    const margin = this.margin();
    const notBefore = (t: number) => Math.max(t, sent);
    if (limit instanceof GCRA) {
      const drain = Math.min(Number(taken * limit.intervalNs) / 1e6, MAX_MS);
      return [sent + this.holdMs, notBefore(sent + drain - margin)];
    }
    let end = resetAfterMs;
    if (limit instanceof Window && limit.algorithm === "SLIDING") end = Math.max(0, end - limit.windowMs);
    const boundary = notBefore(sent + end - margin);
    return [Math.min(sent + this.holdMs, boundary), boundary];
  }
}

/**
 * From Redis's denial of a batch of taken units, its answer for cost units without a second
 * call where the algorithm allows: GCRA (the wait shrinks by (taken − cost)·T) and FIXED
 * (the wait is the window's end for any quantity). undefined: ask Redis (SLIDING, or cost
 * might pass now).
 */
export function denialForCost(limit: Limit, d: Decision, taken: bigint, cost: bigint): Decision | undefined {
  if (d.allowed || d.never || BigInt(d.remaining) >= cost) return undefined;
  let retry = d.retryAfterMs;
  if (limit instanceof GCRA) {
    retry -= Math.min(Number((taken - cost) * limit.intervalNs) / 1e6, MAX_MS);
    if (retry <= 1) return undefined;
    retry = Math.ceil(retry);
  } else if (!(limit instanceof Window && limit.algorithm === "FIXED")) return undefined;
  return makeDecision({ ...d, retryAfterMs: retry });
}
