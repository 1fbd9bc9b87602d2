// The local deny cache (docs/clients.md#local-deny-cache): after Redis denies cost units of
// (key, limit) with retryAfterMs r, a request of the same limit for at least cost units is
// denied here until sent + r, where sent is when the denied request was sent (Redis decided
// at or after that instant, so the local deadline is never later than Redis's). It only ever
// denies. Its answers carry the time left, not the figures Redis gave
// (docs/clients.md#answers-from-the-local-deny-cache). Mirrors clients/go/local.go.

import { performance } from "node:perf_hooks";
import { makeDecision, type Decision } from "./decision.js";

interface Denial {
  until: number;
  resetUntil: number;
  cost: bigint;
  keys: readonly string[];
  decision: Decision;
}

export class DenyCache {
  private readonly entries = new Map<string, Denial>();
  constructor(private readonly maxEntries: number) {}

  static now(): number {
    return performance.now();
  }

  /** A local denial for cost units of ck at now, if one holds. */
  lookup(ck: string, cost: bigint, now = DenyCache.now()): Decision | undefined {
    const e = this.entries.get(ck);
    if (e === undefined) return undefined;
    if (now >= e.until) {
      this.entries.delete(ck);
      return undefined;
    }
    if (cost < e.cost) return undefined; // a smaller request may pass sooner: ask Redis
    const retry = Math.max(Math.ceil(e.until - now), 1);
    const reset = Math.max(Math.ceil(e.resetUntil - now), retry);
    return makeDecision({
      ...e.decision,
      allowed: false,
      never: false,
      remaining: 0,
      retryAfterMs: retry,
      resetAfterMs: reset,
      degraded: false,
      blind: false,
      source: "local",
    });
  }

  /** Remembers a retryable denial decided no earlier than sent. */
  store(ck: string, keys: readonly string[], cost: bigint, d: Decision, sent: number): void {
    if (d.allowed || d.never || d.degraded) return;
    if (!this.entries.has(ck) && this.entries.size >= this.maxEntries) {
      const now = DenyCache.now();
      for (const [k, e] of this.entries) if (e.until <= now) this.entries.delete(k);
      if (this.entries.size >= this.maxEntries) this.entries.clear(); // forgetting costs one round trip
    }
    this.entries.set(ck, {
      until: sent + d.retryAfterMs,
      resetUntil: sent + d.resetAfterMs,
      cost,
      keys,
      decision: d,
    });
  }

  /** Drops every entry that involves key (after a refund). */
  forget(key: string): void {
    for (const [ck, e] of this.entries) if (e.keys.includes(key)) this.entries.delete(ck);
  }
}
