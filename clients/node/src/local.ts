// The failure policy "local" (docs/clients.md#failure-policy-local): while Redis is
// unreachable this process enforces the same limits in memory (memory.ts), each optionally
// divided by a declared fleet size (docs/clients.md#local-with-a-fleet-size), with
// degraded decisions that carry the in-memory limiter's real figures. Mirrors the FailLocal
// parts of clients/go/client.go (localSpec, local, degradedCheck, localAll, degradedLease).

import { fromReply, makeDecision, type Decision, type Refunded } from "./decision.js";
import { GCRA, Lease, Window, type Limit } from "./limits.js";
import { MemoryStore, memSpec, type Five, type MemSpec, type Three } from "./memory.js";

/** The in-memory limits of one limiter and the fleet they are divided by. */
export class LocalLimits {
  readonly memory: MemoryStore;
  private readonly shares = new WeakMap<Limit, [Limit, MemSpec]>();

  constructor(
    readonly fleet: bigint,
    memory?: MemoryStore,
  ) {
    this.memory = memory ?? new MemoryStore();
  }

  /**
   * limit as this process enforces it: each count divided by the fleet size, rounding down,
   * at least 1 (GCRA's burst and rate, a window's or a lease's limit), its name kept; and
   * the store's view of it (exact nanoseconds).
   */
  share(limit: Limit): [Limit, MemSpec] {
    const known = this.shares.get(limit);
    if (known !== undefined) return known;
    const spec = memSpec(limit, this.fleet);
    let shown: Limit = limit;
    if (this.fleet > 1n) {
      const name = limit.name === undefined ? {} : { name: limit.name };
      if (limit instanceof GCRA) {
        const rate = limit.rate / this.fleet > 0n ? limit.rate / this.fleet : 1n;
        shown = new GCRA({ burst: spec.capacity, rate, periodMs: limit.periodMs, ...name });
      } else if (limit instanceof Lease) {
        shown = new Lease({ limit: spec.capacity, leaseMs: limit.leaseMs, ...name });
      } else {
        shown = new Window({
          limit: spec.capacity,
          windowMs: limit.windowMs,
          algorithm: limit.algorithm,
          ...name,
        });
      }
    }
    const out: [Limit, MemSpec] = [shown, spec];
    this.shares.set(limit, out);
    return out;
  }
}

/** Five bigints as the numbers a decision is read from. */
export function numbers(r: readonly bigint[]): number[] {
  return r.map((v) => Number(v));
}

/** A decision of the in-memory limits: degraded, not blind, source "local". */
export function localDecision(
  r: Five,
  limit: Limit | undefined,
  key: string,
  reservation: boolean,
): Decision {
  return makeDecision({ ...fromReply(numbers(r), limit, key, "local", reservation), degraded: true });
}

/** What the in-memory limiter gave back (RL.REFUND's or RL.RELEASE's three), degraded. */
export function localRefunded(r: Three): Refunded {
  return Object.freeze({
    refunded: Math.max(0, Number(r[0])),
    remaining: Math.max(0, Number(r[1])),
    resetAfterMs: Math.max(0, Number(r[2])),
    degraded: true,
  });
}
