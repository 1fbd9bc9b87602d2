// A lease held by acquire: renewed in the background while held, released by release() or
// `await using` (docs/clients.md#leases-that-know-they-are-lost). Mirrors clients/go/lease.go.

import { EventEmitter } from "node:events";
import { randomBytes } from "node:crypto";
import { RedisUnavailableError, usage } from "./errors.js";
import { fromReply, ints, type Decision, type Refunded } from "./decision.js";
import type { Lease } from "./limits.js";
import { errorCode, isUnavailable } from "./protocol.js";
import type { RateLimiter } from "./limiter.js";

/** Why a lease was lost. */
export type LostReason =
  /** A renewal found the token no longer holds a lease (LEASELOST): it lapsed, another holder may have had it. */
  | "not-held"
  /** A renewal was denied (the limit was lowered below what is held). */
  | "denied"
  /** No renewal reached Redis for a whole lease time. */
  | "unreachable";

const REASONS: Record<LostReason, string> = {
  "not-held": "the token no longer holds a lease (it lapsed before a renewal reached Redis)",
  denied: "a renewal was denied (the limit is below what is held)",
  unreachable: "no renewal reached Redis for a whole lease time",
};

/** A lease lost while held: release() and `await using` reject with it. */
export class LeaseLostError extends Error {
  readonly code = "ERR_RL_LEASE_LOST";
  constructor(
    readonly key: string,
    readonly token: string,
    readonly reason: LostReason,
  ) {
    super(`redis-rl: lease on '${key}' lost: ${REASONS[reason]}`);
    this.name = "LeaseLostError";
  }
}

export function newToken(): string {
  return randomBytes(16).toString("hex");
}

const asyncDispose: typeof Symbol.asyncDispose =
  (Symbol as { asyncDispose?: typeof Symbol.asyncDispose }).asyncDispose ??
  (Symbol.for("Symbol.asyncDispose") as typeof Symbol.asyncDispose);

/**
 * A lease held by acquire. Renewed in the background every third of the lease time
 * (RL.LEASE ... RENEW) until released. When a renewal finds it lost (LEASELOST, a denied
 * renewal, or no renewal reaching Redis for a whole lease time) it emits "lost" with the
 * LeaseLostError, counts leasesLost, stops renewing, and release() rejects with that error:
 * work that ran without its slot is never reported as guarded.
 *
 *     await using lease = await limiter.acquire("exports:acme", exports);
 *     lease.on("lost", () => controller.abort());
 */
export class LeaseHandle extends EventEmitter<{ lost: [LeaseLostError] }> {
  private lostError: LeaseLostError | undefined;
  /** The release, once asked for (a second call answers with it). */
  private releasing: Promise<Refunded> | undefined;
  private lastRenewed = Date.now();
  private timer: NodeJS.Timeout | undefined;
  private readonly every: number;

  /** @internal */
  constructor(
    private readonly limiter: RateLimiter,
    /** The key as sent (with the limiter's prefix). */
    readonly key: string,
    readonly lease: Lease,
    /** The holder's token. */
    readonly token: string,
    readonly slots: bigint,
    /** The decision that granted the lease. */
    readonly decision: Decision,
  ) {
    super();
    this.every = Math.max(lease.leaseMs / 3, 1);
    if (!decision.blind) this.schedule();
  }

  /** The LeaseLostError once the lease is lost, else undefined. */
  get lost(): LeaseLostError | undefined {
    return this.lostError;
  }

  private schedule(): void {
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.renew().then(
        () => this.next(),
        () => this.next(),
      );
    }, this.every);
    this.timer.unref();
  }

  private next(): void {
    if (!this.released && !this.lostError) this.schedule();
  }

  private markLost(reason: LostReason): LeaseLostError {
    if (this.lostError) return this.lostError;
    const e = new LeaseLostError(this.key, this.token, reason);
    if (this.released) return e; // a renewal in flight met the freed token
    this.lostError = e;
    if (this.timer) clearTimeout(this.timer);
    this.limiter.counter.add("leasesLost");
    this.limiter.emit({ type: "lease-lost", key: this.key, reason });
    this.emit("lost", e);
    return e;
  }

  /**
   * Renews the lease now (RL.LEASE ... RENEW), outside the failure policy: an outage rejects
   * with RedisUnavailableError, and once a whole lease time has passed without a renewal the
   * lease is lost. The background timer calls it every third of the lease.
   */
  async renew(): Promise<Decision> {
    if (this.lostError) throw this.lostError;
    if (this.released) throw usage(`the lease on '${this.key}' was released`);
    if (this.decision.blind) return this.decision; // open policy: holds nothing anywhere
    if (this.decision.degraded) return this.renewLocally();
    const args = [...this.lease.args(), this.token];
    if (this.slots !== 1n) args.push("QUANTITY", this.slots.toString());
    args.push("RENEW");
    let v: unknown;
    let mode: "module" | "fallback";
    try {
      [v, mode] = await this.limiter.call("lease", [this.key], args, undefined);
    } catch (e) {
      if (errorCode(e) === "LEASELOST") {
        this.limiter.health.success();
        throw this.markLost("not-held");
      }
      if (isUnavailable(e)) {
        this.limiter.counter.add("errors");
        if (Date.now() - this.lastRenewed > this.lease.leaseMs) throw this.markLost("unreachable");
        throw new RedisUnavailableError(e);
      }
      throw e;
    }
    this.limiter.health.success();
    const d = fromReply(ints(v, 5), this.lease, this.key, mode, false);
    if (!d.allowed) throw this.markLost("denied");
    this.lastRenewed = Date.now();
    return d;
  }

  private get released(): boolean {
    return this.releasing !== undefined;
  }

  /**
   * Stops the renewals and frees the slots (RL.RELEASE); harmless twice: a second call
   * answers as the first did (the same result or rejection) without a call. When the lease was
   * lost while held it rejects with the LeaseLostError (after releasing what may still be
   * held).
   */
  release(): Promise<Refunded> {
    this.releasing ??= this.releaseOnce();
    return this.releasing;
  }

  private async releaseOnce(): Promise<Refunded> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    let r: Refunded = Object.freeze({ refunded: 0, remaining: 0, resetAfterMs: 0, degraded: true });
    let err: unknown;
    if (this.decision.degraded && !this.decision.blind && this.limiter.local) {
      r = this.limiter.releaseLocally(this.key, this.token); // the "local" policy's lease: held in memory
    } else if (!this.decision.degraded) {
      try {
        r = await this.limiter.release(this.key.slice(this.limiter.prefix.length), this.token);
      } catch (e) {
        err = e;
      }
    }
    if (this.lostError) throw this.lostError;
    if (err !== undefined) throw err;
    return r;
  }

  /** Renews a lease the "local" policy granted, in memory (RENEW's rule: lost when the token no longer holds it). */
  private renewLocally(): Decision {
    let d: Decision;
    try {
      d = this.limiter.renewLocally(this.key, this.lease, this.token, this.slots);
    } catch (e) {
      if (errorCode(e) === "LEASELOST") throw this.markLost("not-held");
      throw e;
    }
    if (!d.allowed) throw this.markLost("denied");
    this.lastRenewed = Date.now();
    return d;
  }

  /** `await using lease = await limiter.acquire(...)`: releases at the end of the block. */
  async [asyncDispose](): Promise<void> {
    await this.release();
  }
}
