// The answer to one request (docs/clients.md#decision), read from the module's five integers
// (docs/reference.md#r-reply-1). Mirrors clients/go/decision.go.

import type { Limit } from "./limits.js";

/** Who answered: the module's commands, the Lua fallback, or this process. */
export type Source = "module" | "fallback" | "local";

/**
 * A decision. Durations are milliseconds (numbers). A denial is one of two things: denied
 * until `retryAfterMs` has passed, or `never` (the request's cost exceeds the limit, so no
 * wait can admit it: HTTP 413, not 429), when `retryAfterMs` is `Infinity`. There is no -1.
 */
export interface Decision {
  /** The request may go ahead. */
  readonly allowed: boolean;
  /** Denied, and no wait can admit this request; retryAfterMs is then Infinity. */
  readonly never: boolean;
  /** The most requests an idle key admits at once (burst / limit / slots). */
  readonly limit: number;
  /** Requests of cost 1 still allowed right now, after this one. */
  readonly remaining: number;
  /**
   * Denied (not never): ms until this same request would be allowed, at least 1. Never:
   * Infinity. Allowed: 0, or with maxWait the wait before acting.
   */
  readonly retryAfterMs: number;
  /** ms until the key is idle again (0 for an idle key). */
  readonly resetAfterMs: number;
  readonly source: Source;
  /** Redis did not answer: the failure policy decided. */
  readonly degraded: boolean;
  /**
   * The open or closed failure policy answered without counting anything, so an HTTP answer
   * carries no RateLimit field (docs/clients.md#closed-policy).
   */
  readonly blind: boolean;
  /** The limit this decision is about (for a combined decision, the binding one). */
  readonly spec: Limit | undefined;
  /** The key as sent, with the limiter's prefix ("" for a combined decision). */
  readonly key: string;
  /** Each key's decision of a checkAll, in entry order (undefined otherwise). */
  readonly perKey: readonly Decision[] | undefined;
}

export function toInt(v: unknown): number | undefined {
  if (typeof v === "number" && Number.isInteger(v)) return v;
  if (typeof v === "bigint") return Number(v);
  if (typeof v === "string" && /^-?[0-9]+$/.test(v)) return Number(v);
  if (Buffer.isBuffer(v)) return toInt(v.toString());
  return undefined;
}

export class ProtocolError extends Error {
  readonly code = "ERR_RL_PROTOCOL";
  constructor(want: string, got: unknown) {
    super(`redis-rl: unexpected reply: wanted ${want}, got ${JSON.stringify(got, replacer)}`);
    this.name = "ProtocolError";
  }
}

function replacer(_k: string, v: unknown) {
  return typeof v === "bigint" ? v.toString() : v;
}

/** A flat array of n integers. */
export function ints(v: unknown, n: number): number[] {
  if (!Array.isArray(v) || v.length !== n) throw new ProtocolError(`an array of ${n} integers`, v);
  return v.map((x) => {
    const i = toInt(x);
    if (i === undefined) throw new ProtocolError("an integer", x);
    return i;
  });
}

/** RL.ALL's reply: the combined five integers, then each key's. */
export function allReply(v: unknown): [number[], number[][]] {
  if (!Array.isArray(v) || v.length !== 2) throw new ProtocolError("RL.ALL's two-element reply", v);
  const combined = ints(v[0], 5);
  if (!Array.isArray(v[1])) throw new ProtocolError("RL.ALL's per-key replies", v[1]);
  return [combined, v[1].map((e: unknown) => ints(e, 5))];
}

export interface DecisionInit {
  allowed: boolean;
  never?: boolean;
  limit?: number;
  remaining?: number;
  retryAfterMs?: number;
  resetAfterMs?: number;
  source: Source;
  degraded?: boolean;
  blind?: boolean;
  spec?: Limit | undefined;
  key?: string;
  perKey?: readonly Decision[] | undefined;
}

export function makeDecision(d: DecisionInit): Decision {
  return Object.freeze({
    allowed: d.allowed,
    never: d.never ?? false,
    limit: d.limit ?? 0,
    remaining: d.remaining ?? 0,
    retryAfterMs: d.retryAfterMs ?? 0,
    resetAfterMs: d.resetAfterMs ?? 0,
    source: d.source,
    degraded: d.degraded ?? false,
    blind: d.blind ?? false,
    spec: d.spec,
    key: d.key ?? "",
    perKey: d.perKey === undefined ? undefined : Object.freeze([...d.perKey]),
  });
}

/**
 * Reads the module's five integers: -1 for retry_after_ms is a zero wait when allowed and
 * never when denied; with a reservation (maxWait) an allowed reply's retry field is the wait
 * before acting.
 */
export function fromReply(
  r: readonly number[],
  spec: Limit | undefined,
  key: string,
  source: Source,
  reservation: boolean,
): Decision {
  const nonNeg = (v: number) => (v < 0 ? 0 : v);
  const allowed = r[0] === 1;
  let never = false;
  let retry = 0;
  if (allowed && reservation) retry = nonNeg(r[3]!);
  else if (!allowed && r[3]! < 0) {
    never = true;
    retry = Infinity;
  } else if (!allowed) retry = r[3]!;
  return makeDecision({
    allowed,
    never,
    limit: nonNeg(r[1]!),
    remaining: nonNeg(r[2]!),
    retryAfterMs: retry,
    resetAfterMs: nonNeg(r[4]!),
    source,
    spec,
    key,
  });
}

/** What RL.REFUND (or RL.RELEASE) gave back. */
export interface Refunded {
  /** Units given back (slots freed, for a release). */
  readonly refunded: number;
  /**
   * The key's remaining after it: Redis's figures when Redis took part of it, else the
   * "local" policy's in-memory limiter's.
   */
  readonly remaining: number;
  readonly resetAfterMs: number;
  /**
   * Redis gave nothing back: either it did not answer (nothing was given back, except in the
   * "local" policy's memory), or under "local" the whole refund went back to the in-memory
   * limiter that took the charge.
   */
  readonly degraded: boolean;
}

/**
 * RL.ALL's rule for per-key decisions, each with the charge it was asked
 * (docs/reference.md#r-cost-3): the binding limit admits the fewest further calls of this
 * shape (remaining / charge; ties: the smaller remaining, then the first); allowed only if
 * every charged limit allows; never if any can never pass; else the longest wait.
 */
export function combine(per: readonly Decision[], charges: readonly bigint[]): Decision {
  const anyCharged = charges.some((c) => c > 0n);
  let bind = -1;
  let bindCalls = 0n;
  let bindRemaining = 0;
  let allowed = true;
  let never = false;
  let retry = 0;
  let reset = 0;
  per.forEach((d, i) => {
    const ch = charges[i]!;
    if (!(ch > 0n || !anyCharged)) return;
    const rem = BigInt(Math.trunc(d.remaining));
    const calls = ch > 0n ? rem / ch : rem;
    if (bind < 0 || calls < bindCalls || (calls === bindCalls && d.remaining < bindRemaining)) {
      bind = i;
      bindCalls = calls;
      bindRemaining = d.remaining;
    }
    if (!d.allowed) {
      allowed = false;
      if (d.never) never = true;
      else retry = Math.max(retry, d.retryAfterMs);
    }
    reset = Math.max(reset, d.resetAfterMs);
  });
  const b = bind >= 0 ? per[bind] : undefined;
  return makeDecision({
    allowed,
    never: !allowed && never,
    retryAfterMs: allowed ? 0 : never ? Infinity : Math.max(retry, 1),
    resetAfterMs: reset,
    limit: b?.limit ?? 0,
    remaining: b?.remaining ?? 0,
    spec: b?.spec,
    source: per[0]?.source ?? "local",
    degraded: per.some((d) => d.degraded),
    blind: per.some((d) => d.blind),
    perKey: per,
  });
}

/** The limit of a combined decision: the per-key decision whose figures it reports. */
export function binding(combined: { limit: number; remaining: number }, per: readonly Decision[]) {
  return per.find((p) => p.limit === combined.limit && p.remaining === combined.remaining)?.spec;
}
