// The failure policy, the counters and the events hook (docs/clients.md#failure-policy,
// docs/clients.md#counters, docs/clients.md#observability). Mirrors clients/go/policy.go.

import { RedisUnavailableError, describe } from "./errors.js";
import { makeDecision, type Decision } from "./decision.js";
import type { Limit } from "./limits.js";

/**
 * What a check answers when Redis does not: "open" admits (degraded), "closed" denies with a
 * short retry (degraded), "raise" rejects with RedisUnavailableError, "local" enforces the
 * same limits in this process's memory (degraded, with the in-memory limiter's figures;
 * docs/clients.md#failure-policy-local).
 */
export type FailurePolicy = "open" | "closed" | "raise" | "local";

/** The counters, as docs/clients.md#counters names them (camelCased). */
export const COUNTER_NAMES = [
  "allowed",
  "denied",
  "allowedLocally",
  "deniedLocally",
  "degraded",
  "errors",
  "redisCalls",
  "refunded",
  "local",
  "skipped",
  "missingDenied",
  "leasesLost",
  "forwardedUnusable",
  "peerUnknown",
] as const;

export type CounterName = (typeof COUNTER_NAMES)[number];
export type CounterSnapshot = Readonly<Record<CounterName, number>>;

/** Something the limiter tells the application (no console output anywhere). */
export type LimiterEvent =
  | { type: "outage"; error: unknown; policy: FailurePolicy }
  | { type: "recovered"; failures: number; outageMs: number }
  | { type: "library-loaded"; node: string; ours: string; had: string }
  | { type: "library-newer"; node: string; ours: string; theirs: string }
  | { type: "library-kept"; node: string; ours: string; theirs: string; reason: string }
  | { type: "scripts"; reason: string }
  | { type: "lease-lost"; key: string; reason: string };

export class Counters {
  private readonly values = new Map<CounterName, number>(COUNTER_NAMES.map((n) => [n, 0]));
  constructor(private readonly hook: ((name: CounterName, n: number) => void) | undefined) {}
  add(name: CounterName, n = 1): void {
    if (n === 0) return;
    this.values.set(name, (this.values.get(name) ?? 0) + n);
    if (this.hook) {
      try {
        this.hook(name, n);
      } catch {
        // a metrics hook must not break a decision
      }
    }
  }
  countDecision(d: Decision): void {
    this.add(d.allowed ? "allowed" : "denied");
    if (d.degraded) this.add("degraded");
  }
  snapshot(): CounterSnapshot {
    return Object.freeze(Object.fromEntries(this.values)) as CounterSnapshot;
  }
}

/**
 * Tracks Redis failures: one event per burst, a probe interval, recovery. While Redis is
 * failing, calls within probeIntervalMs of the last failure are answered by the policy
 * without waiting on Redis; the first call after it tries Redis again.
 */
export class Health {
  private outage: { started: number; failures: number; nextProbe: number } | undefined;
  constructor(
    readonly policy: FailurePolicy,
    private readonly probeIntervalMs: number,
    private readonly closedRetryAfterMs: number,
    private readonly emit: (e: LimiterEvent) => void,
  ) {}

  /** Whether to answer by policy without trying Redis (inside the probe interval). */
  skip(): boolean {
    if (!this.outage) return false;
    const now = Date.now();
    if (now < this.outage.nextProbe) return true;
    this.outage.nextProbe = now + this.probeIntervalMs; // this caller probes
    return false;
  }

  success(): void {
    const o = this.outage;
    if (!o) return;
    this.outage = undefined;
    this.emit({ type: "recovered", failures: o.failures, outageMs: Date.now() - o.started });
  }

  failure(counters: Counters, cause: unknown): void {
    counters.add("errors");
    const now = Date.now();
    if (!this.outage) {
      this.outage = { started: now, failures: 1, nextProbe: now + this.probeIntervalMs };
      this.emit({ type: "outage", error: cause, policy: this.policy });
    } else {
      this.outage.failures++;
      this.outage.nextProbe = now + this.probeIntervalMs;
    }
  }

  /** The policy's decision for limit on key (or the error, for "raise"). */
  answer(limit: Limit | undefined, key: string, cause: unknown): Decision {
    if (this.policy === "raise") {
      throw new RedisUnavailableError(
        cause ?? new Error("Redis failed within the probe interval; not retried yet"),
      );
    }
    const closed = this.policy === "closed";
    return makeDecision({
      allowed: !closed,
      degraded: true,
      blind: true,
      source: "local",
      spec: limit,
      key,
      limit: limit ? Number(limit.capacity) : 0,
      retryAfterMs: closed ? this.closedRetryAfterMs : 0,
      resetAfterMs: closed ? this.closedRetryAfterMs : 0,
    });
  }
}

export { describe };
