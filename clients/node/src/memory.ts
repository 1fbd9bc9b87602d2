// The limits in process memory, for the failure policy "local"
// (docs/clients.md#failure-policy-local): the module's algorithms in the module's integer
// arithmetic (nanoseconds as bigints, no floats), ported from clients/go/memory.go, which
// follows docs/reference.md and the core's src/algo/*.rs line for line. Every value the
// module keeps in 64 bits is checked against 2^64 - 1 where the module checks it (an
// overflow is the module's error) and saturated where the module saturates; intermediate
// products are exact (bigint), as the module's 128-bit ones are.
//
// MemoryStore answers with the module's reply shapes (five integers; RL.ALL's pair;
// RL.REFUND's and RL.RELEASE's three), as bigints. A key whose state is idle (its reset
// passed) is gone, as an expired Redis key is. A key is kept per algorithm (Redis refuses a
// key used with another algorithm; the calls that reach this store were valid ones).

import { performance } from "node:perf_hooks";
import { RedisReplyError } from "./errors.js";
import { GCRA, Lease, type Limit } from "./limits.js";

const U64 = (1n << 64n) - 1n;
const I63 = (1n << 63n) - 1n;
const NS_PER_MS = 1_000_000n;

const FORCE_WITH_LOG =
  "ERR FORCE cannot be used with LOG: a LOG records each admitted request and never holds more " +
  "than its limit; use FIXED or SLIDING to record usage after the fact";
const FORCE_ON_LEASE =
  "ERR FORCE cannot be used on a LEASE limit: its slots are taken with RL.LEASE and given back " +
  "with RL.RELEASE";
const OVERFLOW =
  "ERR arithmetic overflow: QUANTITY, period and rate would move the key's time past 64-bit " + "nanoseconds";

function overflow(): never {
  throw new RedisReplyError(OVERFLOW);
}

// -- arithmetic ----------------------------------------------------------------------------

const min = (a: bigint, b: bigint) => (a < b ? a : b);
const max = (a: bigint, b: bigint) => (a > b ? a : b);
/** a, at most 2^64 - 1. */
const sat = (a: bigint) => (a > U64 ? U64 : a);
/** a - b, not below zero. */
const since = (a: bigint, b: bigint) => (a > b ? a - b : 0n);
const satAdd = (a: bigint, b: bigint) => sat(a + b);
/** a / d rounded up (d > 0). */
const ceilDiv = (a: bigint, d: bigint) => (a + d - 1n) / d;
const floorTo = (t: bigint, window: bigint) => t - (t % window);
const ceilNsToMs = (ns: bigint) => ceilDiv(ns, NS_PER_MS);
const i63 = (n: bigint) => (n > I63 ? I63 : n);
/** A 64-bit result the module checks: the module's overflow error past 2^64 - 1. */
const checked = (a: bigint) => (a > U64 ? overflow() : a);

// -- verdicts and replies --------------------------------------------------------------------

/** A verdict: allowed, reserved (allowed after a wait, MAXWAIT), denied, never. */
const V = { Allowed: 0, Reserved: 1, Denied: 2, Never: 3 } as const;
export type Verdict = (typeof V)[keyof typeof V];

/** One decision in nanoseconds (wait and reset). */
export interface MDecision {
  kind: Verdict;
  wait: bigint;
  limit: bigint;
  remaining: bigint;
  reset: bigint;
}

const md = (kind: Verdict, wait: bigint, limit: bigint, remaining: bigint, reset: bigint): MDecision => ({
  kind,
  wait,
  limit,
  remaining,
  reset,
});

const admits = (d: MDecision) => d.kind === V.Allowed || d.kind === V.Reserved;

/** The module's five integers (commands/mod.rs five). */
export type Five = [bigint, bigint, bigint, bigint, bigint];
/** RL.REFUND's and RL.RELEASE's three integers. */
export type Three = [bigint, bigint, bigint];

export function five(d: MDecision): Five {
  let retry = -1n;
  if (d.kind === V.Denied) retry = i63(max(1n, ceilNsToMs(d.wait)));
  else if (d.kind === V.Reserved) retry = i63(ceilNsToMs(d.wait));
  return [admits(d) ? 1n : 0n, i63(d.limit), i63(d.remaining), retry, i63(ceilNsToMs(d.reset))];
}

/** RL.ALL's combined decision (decision.rs combine). */
export function combineMemory(decisions: readonly { d: MDecision; cost: bigint }[]): MDecision {
  const anyCharged = decisions.some((x) => x.cost > 0n);
  let binding: MDecision | undefined;
  let best: [bigint, bigint, number] = [0n, 0n, 0];
  let allAllowed = true;
  let anyNever = false;
  let denied = false;
  let wait = 0n;
  let reset = 0n;
  let j = 0;
  for (const x of decisions) {
    if (!(x.cost > 0n || !anyCharged)) continue;
    const d = x.d;
    const per = x.cost > 0n ? d.remaining / x.cost : d.remaining;
    const rank: [bigint, bigint, number] = [per, d.remaining, j];
    if (
      binding === undefined ||
      rank[0] < best[0] ||
      (rank[0] === best[0] && (rank[1] < best[1] || (rank[1] === best[1] && rank[2] < best[2])))
    ) {
      best = rank;
      binding = d;
    }
    allAllowed &&= admits(d);
    anyNever ||= d.kind === V.Never;
    if (d.kind === V.Denied) {
      if (!denied || d.wait > wait) wait = d.wait;
      denied = true;
    }
    reset = max(reset, d.reset);
    j++;
  }
  const out = md(V.Allowed, 0n, 0n, 0n, reset);
  if (!allAllowed) {
    if (anyNever) out.kind = V.Never;
    else {
      out.kind = V.Denied;
      out.wait = denied ? wait : 1n;
    }
  }
  if (binding !== undefined) {
    out.limit = binding.limit;
    out.remaining = binding.remaining;
  }
  return out;
}

// -- GCRA (src/algo/gcra.rs) ------------------------------------------------------------------

export interface GcraState {
  tat: bigint;
  interval: bigint;
  burst: bigint;
  updated: bigint;
}

function gcraEffectiveTat(interval: bigint, s: GcraState | undefined, now: bigint): bigint {
  if (s === undefined || s.tat <= now) return now;
  if (s.interval === interval) return s.tat;
  const written = min(s.updated, s.tat);
  const inUse = s.tat - written;
  const converted = ceilDiv(inUse * interval, max(1n, s.interval));
  return max(sat(written + converted), now);
}

function gcraReport(burst: bigint, interval: bigint, kind: Verdict, wait: bigint, tat: bigint, now: bigint) {
  const inUse = since(tat, now);
  const remaining = sat(since(burst * interval, inUse) / max(1n, interval));
  return md(kind, wait, burst, remaining, inUse);
}

type Step<S> = [MDecision, S | undefined];

export function gcraDecide(
  burst: bigint,
  t: bigint,
  s: GcraState | undefined,
  now: bigint,
  n: bigint,
  maxWait: bigint | undefined,
): Step<GcraState> {
  const tat = gcraEffectiveTat(t, s, now);
  const admitted = maxWait !== undefined ? V.Reserved : V.Allowed;
  if (n === 0n) return [gcraReport(burst, t, admitted, 0n, tat, now), undefined];
  if (n > burst) return [gcraReport(burst, t, V.Never, 0n, tat, now), undefined];
  const newTat = tat + n * t;
  const ahead = newTat - now;
  const tolerance = burst * t;
  const admit = (kind: Verdict, delay: bigint): Step<GcraState> => {
    checked(newTat);
    const arrives = kind === V.Reserved ? min(satAdd(now, delay), newTat) : now;
    return [
      gcraReport(burst, t, kind, delay, newTat, now),
      { tat: newTat, interval: t, burst, updated: arrives },
    ];
  };
  if (ahead <= tolerance) return admit(admitted, 0n);
  const wait = sat(ahead - tolerance);
  if (maxWait !== undefined && wait <= maxWait) return admit(V.Reserved, wait);
  return [gcraReport(burst, t, V.Denied, wait, tat, now), undefined];
}

function gcraForce(burst: bigint, t: bigint, s: GcraState | undefined, now: bigint, n: bigint) {
  if (n === 0n) return gcraDecide(burst, t, s, now, 0n, undefined);
  const cost = checked(t * n);
  const tat = checked(gcraEffectiveTat(t, s, now) + cost);
  return [
    gcraReport(burst, t, V.Allowed, 0n, tat, now),
    { tat, interval: t, burst, updated: now },
  ] as Step<GcraState>;
}

function gcraRefund(s: GcraState, now: bigint, q: bigint): [GcraState | undefined, bigint] {
  const t = max(1n, s.interval);
  const inUse = since(s.tat, now);
  const refunded = min(q, sat(ceilDiv(inUse, t)));
  const back = q * t;
  const tat = back < inUse ? s.tat - back : now;
  if (tat <= now) return [undefined, refunded];
  return [{ ...s, tat, updated: min(s.updated, tat) }, refunded];
}

// -- FIXED (src/algo/fixed_window.rs) -----------------------------------------------------------

export interface FixedState {
  window: bigint;
  limit: bigint;
  windowStart: bigint;
  count: bigint;
  updated: bigint;
}

const fixedCount = (s: FixedState | undefined, windowStart: bigint) =>
  s !== undefined && s.updated >= windowStart ? s.count : 0n;

export function fixedDecide(
  limit: bigint,
  window: bigint,
  s: FixedState | undefined,
  now: bigint,
  n: bigint,
  force: boolean,
): Step<FixedState> {
  const at = s !== undefined ? max(now, s.updated) : now;
  const start = floorTo(at, window);
  const end = checked(start + window);
  const toEnd = since(end, now);
  const count = fixedCount(s, start);
  const report = (kind: Verdict, wait: bigint, after: bigint) =>
    md(kind, wait, limit, since(limit, after), after > 0n ? toEnd : 0n);
  if (n === 0n) return [report(V.Allowed, 0n, count), undefined];
  if (force) {
    const after = checked(count + n);
    return [
      md(V.Allowed, 0n, limit, since(limit, after), toEnd),
      { window, limit, windowStart: start, count: after, updated: at },
    ];
  }
  if (n > limit) return [report(V.Never, 0n, count), undefined];
  if (count > limit - n) return [report(V.Denied, toEnd, count), undefined];
  return [
    report(V.Allowed, 0n, count + n),
    { window, limit, windowStart: start, count: count + n, updated: at },
  ];
}

function fixedRefund(s: FixedState, now: bigint, q: bigint): [FixedState | undefined, bigint] {
  const start = floorTo(max(now, s.updated), s.window);
  const count = fixedCount(s, start);
  const refunded = min(q, count);
  const left = count - refunded;
  if (left === 0n) return [undefined, refunded];
  return [{ ...s, count: left }, refunded];
}

// -- SLIDING (src/algo/sliding_window.rs) -------------------------------------------------------

export interface SlidingState {
  window: bigint;
  limit: bigint;
  windowStart: bigint;
  prev: bigint;
  curr: bigint;
  updated: bigint;
}

function slidingCounts(s: SlidingState | undefined, now: bigint, window: bigint): [bigint, bigint] {
  if (s === undefined) return [0n, 0n];
  const start = floorTo(now, window);
  const prevStart = since(start, window);
  let prev = 0n;
  let curr = 0n;
  const place = (last: bigint, n: bigint) => {
    if (n === 0n) return;
    if (last >= start) curr = satAdd(curr, n);
    else if (last >= prevStart && start > 0n) prev = satAdd(prev, n);
  };
  place(max(s.updated, s.windowStart), s.curr);
  if (s.windowStart >= 1n) place(s.windowStart - 1n, s.prev);
  return [prev, curr];
}

const scaledEstimate = (prev: bigint, curr: bigint, elapsed: bigint, window: bigint) =>
  prev * since(window, elapsed) + curr * window;

function earliestOffset(prev: bigint, room: bigint, startFrom: bigint, window: bigint): bigint | undefined {
  if (prev === 0n) return startFrom;
  const k = (room * window) / prev;
  if (k >= window) return startFrom;
  const e = window - k;
  if (e < window) return max(e, startFrom);
  return undefined;
}

export function slidingDecide(
  limit: bigint,
  window: bigint,
  s: SlidingState | undefined,
  now: bigint,
  n: bigint,
  force: boolean,
): Step<SlidingState> {
  const at = s !== undefined ? max(now, s.updated) : now;
  const start = floorTo(at, window);
  const elapsed = at - start;
  const nextEnd = checked(start + window + window);
  const end = start + window;
  const [prev, curr] = slidingCounts(s, at, window);
  const limitScaled = limit * window;
  const report = (kind: Verdict, wait: bigint, p: bigint, c: bigint) => {
    const est = scaledEstimate(p, c, elapsed, window);
    const remaining = sat(since(limitScaled, est) / window);
    const reset = c > 0n ? since(nextEnd, now) : p > 0n ? since(end, now) : 0n;
    return md(kind, wait, limit, remaining, reset);
  };
  if (n === 0n) return [report(V.Allowed, 0n, prev, curr), undefined];
  if (force) {
    const after = checked(curr + n);
    const d = report(V.Allowed, 0n, prev, after);
    d.reset = since(nextEnd, now);
    return [d, { window, limit, windowStart: start, prev, curr: after, updated: at }];
  }
  if (n > limit) return [report(V.Never, 0n, prev, curr), undefined];
  if (scaledEstimate(prev, curr, elapsed, window) + n * window <= limitScaled) {
    const after = checked(curr + n);
    return [
      report(V.Allowed, 0n, prev, after),
      { window, limit, windowStart: start, prev, curr: after, updated: at },
    ];
  }
  let offset: bigint | undefined;
  const cn = curr + n;
  if (cn <= limit) offset = earliestOffset(prev, limit - cn, elapsed, window);
  let admitsAt: bigint;
  if (offset !== undefined) admitsAt = satAdd(start, offset);
  else {
    const nxt = earliestOffset(curr, limit - n, 0n, window);
    admitsAt = nxt !== undefined ? satAdd(end, nxt) : nextEnd;
  }
  return [report(V.Denied, max(1n, since(admitsAt, now)), prev, curr), undefined];
}

function slidingRefund(s: SlidingState, now: bigint, q: bigint): [SlidingState | undefined, bigint] {
  const at = max(now, s.updated);
  const start = floorTo(at, s.window);
  const [prev, c] = slidingCounts(s, at, s.window);
  const refunded = min(q, c);
  const curr = c - refunded;
  if (curr === 0n && prev === 0n) return [undefined, refunded];
  const updated = curr > 0n ? max(s.updated, start) : start;
  return [{ window: s.window, limit: s.limit, windowStart: start, prev, curr, updated }, refunded];
}

// -- LOG (src/algo/sliding_log.rs) ----------------------------------------------------------------

interface LogEntry {
  at: bigint;
  count: bigint;
}

export interface LogState {
  window: bigint;
  limit: bigint;
  /** Oldest first. */
  entries: LogEntry[];
}

/** now - window, undefined when now < window (everything is in the window). */
const logCutoff = (now: bigint, window: bigint) => (now >= window ? now - window : undefined);

function countAfter(s: LogState, cutoff: bigint | undefined): bigint {
  let n = 0n;
  for (const e of s.entries) if (cutoff === undefined || e.at > cutoff) n = satAdd(n, e.count);
  return n;
}

function nthAfter(s: LogState, cutoff: bigint | undefined, n: bigint): bigint | undefined {
  let seen = 0n;
  for (const e of s.entries) {
    if (cutoff !== undefined && e.at <= cutoff) continue;
    seen = satAdd(seen, e.count);
    if (seen >= n) return e.at;
  }
  return undefined;
}

const copied = (s: LogState): LogState => ({
  window: s.window,
  limit: s.limit,
  entries: s.entries.map((e) => ({ ...e })),
});

function dropUntil(s: LogState, cutoff: bigint): void {
  s.entries = s.entries.filter((e) => e.at > cutoff);
}

function push(s: LogState, at: bigint, count: bigint): void {
  const last = s.entries[s.entries.length - 1];
  if (last !== undefined && at <= last.at) last.count += count;
  else s.entries.push({ at, count });
}

function popBack(s: LogState, count: bigint): void {
  while (count > 0n && s.entries.length > 0) {
    const last = s.entries[s.entries.length - 1]!;
    const taken = min(count, last.count);
    last.count -= taken;
    count -= taken;
    if (last.count === 0n) s.entries.pop();
  }
}

export function logDecide(
  limit: bigint,
  window: bigint,
  s: LogState | undefined,
  now: bigint,
  n: bigint,
): Step<LogState> {
  const cutoff = logCutoff(now, window);
  let inWindow = 0n;
  let newest: bigint | undefined;
  if (s !== undefined) {
    inWindow = countAfter(s, cutoff);
    newest = s.entries[s.entries.length - 1]?.at;
  }
  if (newest !== undefined && cutoff !== undefined && newest <= cutoff) newest = undefined;
  const report = (kind: Verdict, wait: bigint, count: bigint, last: bigint | undefined) => {
    const reset = last !== undefined ? since(checked(last + window), now) : 0n;
    return md(kind, wait, limit, since(limit, count), reset);
  };
  if (n === 0n) return [report(V.Allowed, 0n, inWindow, newest), undefined];
  if (n > limit) return [report(V.Never, 0n, inWindow, newest), undefined];
  const after = checked(inWindow + n);
  if (after <= limit) {
    const written: LogState =
      s !== undefined ? { ...copied(s), window, limit } : { window, limit, entries: [] };
    if (cutoff !== undefined) dropUntil(written, cutoff);
    push(written, now, n);
    const last = newest !== undefined ? max(newest, now) : now;
    return [report(V.Allowed, 0n, after, last), written];
  }
  const need = after - limit;
  const at = s !== undefined ? nthAfter(s, cutoff, need) : undefined;
  const leavesAt = at !== undefined ? checked(at + window) : satAdd(now, window);
  return [report(V.Denied, max(1n, since(leavesAt, now)), inWindow, newest), undefined];
}

function logRefund(s: LogState, now: bigint, q: bigint): [LogState | undefined, bigint] {
  const cutoff = logCutoff(now, s.window);
  const inWindow = countAfter(s, cutoff);
  const refunded = min(q, inWindow);
  if (refunded === 0n) return [s, 0n];
  if (refunded >= inWindow) return [undefined, refunded];
  const after = copied(s);
  if (cutoff !== undefined) dropUntil(after, cutoff);
  popBack(after, q);
  return [after, refunded];
}

// -- LEASE (src/algo/lease.rs) --------------------------------------------------------------------

interface Held {
  slots: bigint;
  expiry: bigint;
}

export interface LeaseState {
  limit: bigint;
  /** token -> slots, expiry */
  held: Map<string, Held>;
}

function live(s: LeaseState | undefined, now: bigint): Map<string, Held> {
  const out = new Map<string, Held>();
  if (s === undefined) return out;
  for (const [t, h] of s.held) if (h.expiry > now) out.set(t, h);
  return out;
}

function leaseReport(s: LeaseState, now: bigint): MDecision {
  let slots = 0n;
  let last: bigint | undefined;
  for (const h of live(s, now).values()) {
    slots = satAdd(slots, h.slots);
    if (last === undefined || h.expiry > last) last = h.expiry;
  }
  return md(V.Allowed, 0n, s.limit, since(s.limit, slots), last !== undefined ? since(last, now) : 0n);
}

export function leaseDecide(
  limit: bigint,
  leaseNs: bigint,
  s: LeaseState | undefined,
  now: bigint,
  token: string,
  n: bigint,
): Step<LeaseState> {
  const held = live(s, now);
  const own = held.get(token);
  const others = new Map<string, Held>();
  let heldOthers = 0n;
  let lastNow: bigint | undefined;
  for (const [t, h] of held) {
    if (lastNow === undefined || h.expiry > lastNow) lastNow = h.expiry;
    if (t !== token) {
      others.set(t, h);
      heldOthers = satAdd(heldOthers, h.slots);
    }
  }
  const heldNow = own !== undefined ? satAdd(heldOthers, own.slots) : heldOthers;
  const report = (kind: Verdict, wait: bigint, h: bigint, last: bigint | undefined) =>
    md(kind, wait, limit, since(limit, h), last !== undefined ? since(last, now) : 0n);
  if (n === 0n) return [report(V.Allowed, 0n, heldNow, lastNow), undefined];
  if (n > limit) return [report(V.Never, 0n, heldNow, lastNow), undefined];
  if (heldOthers <= limit - n) {
    const expires = checked(now + leaseNs);
    let last = expires;
    for (const h of others.values()) last = max(last, h.expiry);
    const written: LeaseState = { limit, held: new Map(others) };
    written.held.set(token, { slots: n, expiry: expires });
    return [report(V.Allowed, 0n, heldOthers + n, last), written];
  }
  let need = heldOthers - (limit - n);
  const sorted = [...others.values()].sort((a, b) =>
    a.expiry !== b.expiry
      ? a.expiry < b.expiry
        ? -1
        : 1
      : a.slots < b.slots
        ? -1
        : a.slots > b.slots
          ? 1
          : 0,
  );
  let at = satAdd(now, leaseNs);
  for (const h of sorted) {
    if (h.slots >= need) {
      at = h.expiry;
      break;
    }
    need -= h.slots;
  }
  return [report(V.Denied, max(1n, since(at, now)), heldNow, lastNow), undefined];
}

function shown(s: string): string {
  return [...s].slice(0, 64).join("");
}

// -- the store -------------------------------------------------------------------------------------

/** A limit as the store evaluates it: its algorithm and its parameters in nanoseconds. */
export interface MemSpec {
  /** G(CRA), F(IXED), S(LIDING), L(OG), (leas)E */
  kind: "G" | "F" | "S" | "L" | "E";
  /** burst / limit / slots */
  capacity: bigint;
  /** GCRA's emission interval (ns); 0 otherwise. */
  interval: bigint;
  /** The window or lease time (ns); GCRA's period. */
  span: bigint;
}

/** The store's view of a limit, optionally divided by a fleet (rounding down, at least 1). */
export function memSpec(limit: Limit, fleet = 1n): MemSpec {
  const div = (n: bigint) => (fleet <= 1n ? n : max(1n, n / fleet));
  if (limit instanceof GCRA) {
    const rate = div(limit.rate);
    // The GCRA constructor's emission interval (rounded to the nearest ns).
    const interval = (limit.periodNs + rate / 2n) / rate;
    return { kind: "G", capacity: div(limit.burst), interval, span: limit.periodNs };
  }
  if (limit instanceof Lease)
    return { kind: "E", capacity: div(limit.limit), interval: 0n, span: limit.leaseNs };
  const kind = limit.algorithm === "FIXED" ? "F" : limit.algorithm === "LOG" ? "L" : "S";
  return { kind, capacity: div(limit.limit), interval: 0n, span: limit.windowNs };
}

type State = GcraState | FixedState | SlidingState | LogState | LeaseState;

interface StoreEntry {
  key: string;
  kind: MemSpec["kind"];
  state: State;
  expireAtMs: bigint;
  /**
   * The units this store charged the key (checks, FORCE) and has not given back yet: a
   * refund after Redis answers again gives them back here, where they were taken
   * (refundOwed with owedOnly). It lives as long as the key does.
   */
  owed: bigint;
}

/** The host's clock: nanoseconds since the epoch, at microsecond resolution (as the module reads it). */
export function hostClock(): bigint {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1000)) * 1000n;
}

/** One limit of checkAll: its key, limit, own cost and lease token. */
export interface MemoryItem {
  key: string;
  spec: MemSpec;
  cost?: bigint | undefined;
  token?: string | undefined;
}

/**
 * The in-memory limits of one limiter. At most maxKeys keys are kept (the least recently
 * written go first when more are made): an outage with very many distinct clients forgets
 * the oldest, never grows without bound. `clock` gives nanoseconds since the epoch.
 */
export class MemoryStore {
  /** By `${kind}\0${key}`, least recently written first (a Map keeps insertion order). */
  private readonly keys = new Map<string, StoreEntry>();

  constructor(
    readonly maxKeys = 100_000,
    readonly clock: () => bigint = hostClock,
  ) {}

  /** How many keys the store holds (idle ones not yet met included). */
  get size(): number {
    return this.keys.size;
  }

  private load(key: string, kind: MemSpec["kind"], now: bigint): State | undefined {
    const id = `${kind}\0${key}`;
    const e = this.keys.get(id);
    if (e === undefined) return undefined;
    if (now / NS_PER_MS > e.expireAtMs) {
      // Redis: expired once its ms clock passes the expiry
      this.keys.delete(id);
      return undefined;
    }
    return e.state;
  }

  /** Writes key's state (undefined: idle, gone); charged units are added to what the key owes. */
  private put(
    key: string,
    kind: MemSpec["kind"],
    state: State | undefined,
    now: bigint,
    reset: bigint,
    charged: bigint,
  ): void {
    const id = `${kind}\0${key}`;
    if (state === undefined) {
      this.keys.delete(id);
      return;
    }
    // The module's expiry: the instant the key is idle, rounded up to the millisecond
    // (docs/reference.md#r-time-4).
    const expireAtMs = sat(ceilDiv(now + reset, NS_PER_MS));
    const e = this.keys.get(id);
    this.keys.delete(id);
    this.keys.set(id, { key, kind, state, expireAtMs, owed: satAdd(e?.owed ?? 0n, charged) });
    while (this.keys.size > this.maxKeys) {
      const first = this.keys.keys().next();
      if (first.done) break;
      this.keys.delete(first.value);
    }
  }

  /** Evaluates one limit; the state is what to write when it admits (undefined: nothing). */
  private decide(
    key: string,
    s: MemSpec,
    now: bigint,
    n: bigint,
    force: boolean,
    maxWait: bigint | undefined,
    token: string,
  ): Step<State> {
    const st = this.load(key, s.kind, now);
    if (force && s.kind === "E") throw new RedisReplyError(FORCE_ON_LEASE);
    if (force && s.kind === "L") throw new RedisReplyError(FORCE_WITH_LOG);
    switch (s.kind) {
      case "G": {
        const g = st as GcraState | undefined;
        return force
          ? gcraForce(s.capacity, s.interval, g, now, n)
          : gcraDecide(s.capacity, s.interval, g, now, n, maxWait);
      }
      case "E":
        return leaseDecide(s.capacity, s.span, st as LeaseState | undefined, now, token, n);
      case "F":
        return fixedDecide(s.capacity, s.span, st as FixedState | undefined, now, n, force);
      case "S":
        return slidingDecide(s.capacity, s.span, st as SlidingState | undefined, now, n, force);
      default:
        return logDecide(s.capacity, s.span, st as LogState | undefined, now, n);
    }
  }

  /** RL.GCRA / RL.WINDOW: the five integers. maxWaitMs undefined: no MAXWAIT. */
  check(key: string, s: MemSpec, n: bigint, peek: boolean, force: boolean, maxWaitMs?: number): Five {
    const maxWait = maxWaitMs === undefined ? undefined : sat(BigInt(Math.floor(maxWaitMs)) * NS_PER_MS);
    const now = this.clock();
    const [d, write] = this.decide(key, s, now, n, force, maxWait, "");
    if (write !== undefined && !peek && admits(d)) this.put(key, s.kind, write, now, d.reset, n);
    return five(d);
  }

  /** RL.ALL: the combined five and each key's, all or nothing. */
  checkAll(items: readonly MemoryItem[], cost: bigint, peek: boolean, force: boolean): [Five, Five[]] {
    const now = this.clock();
    const all = items.map((it) => {
      const charge = it.cost ?? cost;
      const [d, write] = this.decide(it.key, it.spec, now, charge, force, undefined, it.token ?? "");
      return { it, charge, d, write };
    });
    const combined =
      all.length === 1 ? all[0]!.d : combineMemory(all.map((x) => ({ d: x.d, cost: x.charge })));
    const mayWrite = all.some((x) => x.charge > 0n);
    if (!peek && mayWrite && admits(combined)) {
      for (const x of all) {
        if (x.write !== undefined) this.put(x.it.key, x.it.spec.kind, x.write, now, x.d.reset, x.charge);
      }
    }
    return [five(combined), all.map((x) => five(x.d))];
  }

  /** RL.LEASE (renew: LEASELOST when token holds no live lease). */
  lease(key: string, s: MemSpec, token: string, slots: bigint, peek: boolean, renew: boolean): Five {
    const now = this.clock();
    if (renew) {
      const st = this.load(key, "E", now) as LeaseState | undefined;
      if (st === undefined || !live(st, now).has(token)) {
        throw new RedisReplyError(`LEASELOST lease '${shown(token)}' on key '${shown(key)}' is not held`);
      }
    }
    const [d, write] = this.decide(key, s, now, slots, false, undefined, token);
    if (write !== undefined && !peek && admits(d)) this.put(key, "E", write, now, d.reset, 0n);
    return five(d);
  }

  /** RL.RELEASE: released, remaining, reset after (ms). */
  release(key: string, token: string): Three {
    const now = this.clock();
    const st = this.load(key, "E", now) as LeaseState | undefined;
    if (st === undefined) return [0n, 0n, 0n];
    const held = live(st, now);
    const h = held.get(token);
    if (h === undefined) {
      const d = leaseReport(st, now);
      return [0n, i63(d.remaining), i63(ceilNsToMs(d.reset))];
    }
    held.delete(token);
    const after: LeaseState = { limit: st.limit, held };
    const d = leaseReport(after, now);
    this.put(key, "E", held.size > 0 ? after : undefined, now, d.reset, 0n);
    return [i63(h.slots), i63(d.remaining), i63(ceilNsToMs(d.reset))];
  }

  /** RL.REFUND on whichever rate key key holds: refunded, remaining, reset after (ms); zeros for a key it does not hold. */
  refund(key: string, q: bigint): Three {
    return this.refundOwed(key, q, false)[1];
  }

  /**
   * refund that also settles what key owes. With owedOnly it takes at most the units this
   * store charged the key and has not given back (none: taken 0 and zeros, nothing done), so
   * that a refund of charges taken here comes back here and the rest can go to Redis; taken
   * is the part of q it answered for (all of q without owedOnly, once it holds the key; 0
   * when it does not hold it).
   */
  refundOwed(key: string, q: bigint, owedOnly: boolean): [bigint, Three] {
    const now = this.clock();
    for (const kind of ["G", "F", "S", "L"] as const) {
      const st = this.load(key, kind, now);
      if (st === undefined) continue;
      const e = this.keys.get(`${kind}\0${key}`)!;
      let take = q;
      if (owedOnly) {
        take = min(q, e.owed);
        if (take === 0n) continue;
      }
      e.owed -= min(take, e.owed);
      const [limit, after, refunded] = refundState(st, now, take);
      if (refunded === 0n) {
        const d = reportState(st, now);
        return [take, [0n, i63(d.remaining), i63(ceilNsToMs(d.reset))]];
      }
      if (after === undefined) {
        this.put(key, kind, undefined, now, 0n, 0n);
        return [take, [i63(refunded), i63(limit), 0n]];
      }
      const d = reportState(after, now);
      this.put(key, kind, after, now, d.reset, 0n);
      return [take, [i63(refunded), i63(d.remaining), i63(ceilNsToMs(d.reset))]];
    }
    return [0n, [0n, 0n, 0n]];
  }
}

function isGcra(s: State): s is GcraState {
  return "tat" in s;
}
function isFixed(s: State): s is FixedState {
  return "count" in s;
}
function isSliding(s: State): s is SlidingState {
  return "curr" in s;
}
function isLog(s: State): s is LogState {
  return "entries" in s;
}

/** Gives back up to q units of a rate state: the limit, the state after (undefined: idle), the units given back. */
function refundState(st: State, now: bigint, q: bigint): [bigint, State | undefined, bigint] {
  if (isGcra(st)) {
    const [after, n] = gcraRefund(st, now, q);
    return [st.burst, after, n];
  }
  if (isFixed(st)) {
    const [after, n] = fixedRefund(st, now, q);
    return [st.limit, after, n];
  }
  if (isSliding(st)) {
    const [after, n] = slidingRefund(st, now, q);
    return [st.limit, after, n];
  }
  if (isLog(st)) {
    const [after, n] = logRefund(st, now, q);
    return [st.limit, after, n];
  }
  return [0n, undefined, 0n];
}

/** A state's figures now (QUANTITY 0). */
function reportState(st: State, now: bigint): MDecision {
  if (isGcra(st)) return gcraDecide(st.burst, st.interval, st, now, 0n, undefined)[0];
  if (isFixed(st)) return fixedDecide(st.limit, st.window, st, now, 0n, false)[0];
  if (isSliding(st)) return slidingDecide(st.limit, st.window, st, now, 0n, false)[0];
  if (isLog(st)) return logDecide(st.limit, st.window, st, now, 0n)[0];
  return leaseReport(st, now);
}
