// Limits are values (docs/clients.md#limits-are-values): GCRA, Window and Lease, validated
// when built with the module's rules and messages (docs/reference.md#r-arg-1,
// docs/reference.md#r-arg-2, docs/reference.md#r-arg-4), and the limit strings users write
// (docs/clients.md#limit-strings). Mirrors clients/go/limits.go.

import { invalid, refuseUnknown, badOption } from "./errors.js";

/** The longest period, window or lease the module accepts, in seconds: ten 365-day years. */
export const MAX_SECONDS = 315_360_000;
const MAX_NS = BigInt(MAX_SECONDS) * 1_000_000_000n;
const U64_MAX = (1n << 64n) - 1n;

/** A count: a non-negative safe integer, or a bigint up to 2^64 - 1. */
export type Count = number | bigint;

/** A window algorithm of RL.WINDOW. */
export type Algorithm = "FIXED" | "SLIDING" | "LOG";

function spanError(name: string) {
  return invalid(
    `${name}Ms must be a number of milliseconds (to the nanosecond), > 0 and <= ${MAX_SECONDS * 1000} (${MAX_SECONDS} s)`,
  );
}

/**
 * Why `v` is not a count for `name`: a number beyond 2^53 - 1 (which a number cannot hold
 * exactly), a bigint beyond 2^64 - 1, or not an integer of the right sign at all.
 */
export function countError(v: unknown, name: string, what: "positive" | "non-negative") {
  if (typeof v === "number" && Number.isInteger(v) && v > Number.MAX_SAFE_INTEGER) {
    return invalid(`${name} must be a safe integer (at most 2^53 - 1) or a bigint, not ${v}`);
  }
  if (typeof v === "bigint" && v > U64_MAX) return invalid(`${name} must be at most 2^64 - 1`);
  return invalid(`${name} must be a ${what} integer`);
}

/** A count as a bigint, or undefined when it is not an integer in 0 .. 2^64-1. */
export function toCount(v: unknown): bigint | undefined {
  if (typeof v === "bigint") return v >= 0n && v <= U64_MAX ? v : undefined;
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  return undefined;
}

function positive(v: unknown, name: string): bigint {
  const n = toCount(v);
  if (n === undefined || n === 0n) throw countError(v, name, "positive");
  return n;
}

/** Milliseconds (a finite number, fractions down to the nanosecond) as nanoseconds. */
export function msToNs(ms: number): bigint | undefined {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms <= 0) return undefined;
  const whole = Math.trunc(ms);
  return BigInt(whole) * 1_000_000n + BigInt(Math.round((ms - whole) * 1e6));
}

function span(ms: unknown, name: string): bigint {
  const ns = typeof ms === "number" ? msToNs(ms) : undefined;
  if (ns === undefined || ns <= 0n || ns > MAX_NS) throw spanError(name);
  return ns;
}

/** Nanoseconds as the module's plain decimal seconds, exactly: 1_500_000_000n is "1.5". */
export function formatSeconds(ns: bigint): string {
  if (ns <= 0n) return "0";
  const whole = ns / 1_000_000_000n;
  const frac = ns % 1_000_000_000n;
  if (frac === 0n) return whole.toString();
  return `${whole}.${frac.toString().padStart(9, "0").replace(/0+$/, "")}`;
}

function checkName(name: unknown): string {
  if (typeof name !== "string" || name === "" || !/^[\x20-\x7e]+$/.test(name)) {
    throw invalid("name must be non-empty printable ASCII (it is sent in HTTP headers)");
  }
  return name;
}

/** Throws the module's error for a lease token that is not 1 to 64 bytes. */
export function checkToken(token: unknown): string {
  if (typeof token !== "string" || token.length === 0 || Buffer.byteLength(token, "utf8") > 64) {
    throw invalid("token must be 1 to 64 bytes");
  }
  return token;
}

/** Reads "fixed", "SLIDING", "Log" (any case). */
export function parseAlgorithm(s: unknown): Algorithm {
  const up = typeof s === "string" ? s.toUpperCase() : "";
  if (up === "FIXED" || up === "SLIDING" || up === "LOG") return up;
  throw invalid(`algorithm must be FIXED, SLIDING or LOG, not '${String(s)}'`);
}

abstract class LimitBase {
  /** The most requests an idle key admits at once (burst / limit / slots). */
  abstract readonly capacity: bigint;
  /** The name given for the HTTP RateLimit fields (undefined if none). */
  abstract readonly name: string | undefined;
  /** @internal The command arguments after the key (module command form). */
  abstract args(): string[];
  /** @internal The RL.ALL spec word. */
  abstract head(): "GCRA" | "WINDOW" | "LEASE";
  /** @internal Identifies the limit (kind, parameters, name). */
  abstract ident(): string;
  /**
   * The w of the IETF RateLimit-Policy field, in ms: the window of a Window, the time an
   * empty GCRA bucket takes to fill (burst · period / rate); undefined for a Lease.
   */
  abstract policyWindowMs(): number | undefined;
}

/** Options of GCRA. */
export interface GCRAOptions {
  /** Requests an idle key admits at once (>= 1). */
  burst: Count;
  /** Requests per period (>= 1). */
  rate: Count;
  /** The period, in milliseconds (fractions down to 1 ns; at most MAX_SECONDS s). */
  periodMs: number;
  /** A name for the HTTP RateLimit fields (printable ASCII). */
  name?: string;
}

/**
 * A token bucket (RL.GCRA): `burst` requests at once, refilled at `rate` per `periodMs`.
 * The emission interval T = period / rate (rounded to the nearest ns, at least 1 ns) is the
 * cost of one request (docs/reference.md#r-gcra-1).
 */
export class GCRA extends LimitBase {
  readonly burst: bigint;
  readonly rate: bigint;
  /** @internal */
  readonly periodNs: bigint;
  /** @internal */
  readonly intervalNs: bigint;
  override readonly name: string | undefined;

  constructor(options: GCRAOptions) {
    super();
    refuseUnknown(options, ["burst", "rate", "periodMs", "name"], "GCRA");
    if (options === undefined || options === null) throw badOption("GCRA needs {burst, rate, periodMs}");
    this.burst = positive(options.burst, "burst");
    this.rate = positive(options.rate, "rate");
    this.periodNs = span(options.periodMs, "period");
    const interval = (this.periodNs + this.rate / 2n) / this.rate;
    if (interval === 0n) {
      throw invalid("rate is too high for period: the emission interval period/rate is below 1 ns");
    }
    if (this.burst * interval > U64_MAX) {
      throw invalid("burst is too large: burst * period / rate overflows 64-bit nanoseconds");
    }
    this.intervalNs = interval;
    this.name = options.name === undefined ? undefined : checkName(options.name);
    Object.freeze(this);
  }
  override get capacity(): bigint {
    return this.burst;
  }
  /** The period in ms. */
  get periodMs(): number {
    return Number(this.periodNs) / 1e6;
  }
  /** T = period / rate, in ms: the time one request costs. */
  get emissionIntervalMs(): number {
    return Number(this.intervalNs) / 1e6;
  }
  args(): string[] {
    return [this.burst.toString(), this.rate.toString(), formatSeconds(this.periodNs)];
  }
  head() {
    return "GCRA" as const;
  }
  ident(): string {
    return `G ${this.burst} ${this.rate} ${this.periodNs}\0${this.name ?? ""}`;
  }
  policyWindowMs(): number {
    return Number(this.burst * this.intervalNs) / 1e6;
  }
  override toString(): string {
    return `GCRA(burst=${this.burst}, rate=${this.rate}, period=${formatSeconds(this.periodNs)}s)`;
  }
}

/** Options of Window. */
export interface WindowOptions {
  /** Requests allowed per window (>= 1). */
  limit: Count;
  /** The window, in milliseconds. */
  windowMs: number;
  /** FIXED, SLIDING (the default) or LOG, any case. */
  algorithm?: Algorithm | Lowercase<Algorithm>;
  name?: string;
}

/** At most `limit` requests in any window (RL.WINDOW: FIXED, SLIDING or LOG). */
export class Window extends LimitBase {
  readonly limit: bigint;
  /** @internal */
  readonly windowNs: bigint;
  readonly algorithm: Algorithm;
  override readonly name: string | undefined;

  constructor(options: WindowOptions) {
    super();
    refuseUnknown(options, ["limit", "windowMs", "algorithm", "name"], "Window");
    if (options === undefined || options === null) throw badOption("Window needs {limit, windowMs}");
    this.limit = positive(options.limit, "limit");
    this.windowNs = span(options.windowMs, "window");
    this.algorithm = options.algorithm === undefined ? "SLIDING" : parseAlgorithm(options.algorithm);
    this.name = options.name === undefined ? undefined : checkName(options.name);
    Object.freeze(this);
  }
  override get capacity(): bigint {
    return this.limit;
  }
  get windowMs(): number {
    return Number(this.windowNs) / 1e6;
  }
  args(): string[] {
    return [this.limit.toString(), formatSeconds(this.windowNs), this.algorithm];
  }
  head() {
    return "WINDOW" as const;
  }
  ident(): string {
    return `W ${this.limit} ${this.windowNs} ${this.algorithm}\0${this.name ?? ""}`;
  }
  policyWindowMs(): number {
    return this.windowMs;
  }
  override toString(): string {
    return `Window(limit=${this.limit}, window=${formatSeconds(this.windowNs)}s, ${this.algorithm})`;
  }
}

/** Options of Lease. */
export interface LeaseOptions {
  /** Slots that may be held at once (>= 1). */
  limit: Count;
  /** The longest a holder keeps its slots without renewing, in milliseconds. */
  leaseMs: number;
  name?: string;
}

/**
 * A concurrency limit (RL.LEASE): at most `limit` slots held at once, each for `leaseMs`
 * unless renewed; a crashed holder's slots come back when its lease ends.
 */
export class Lease extends LimitBase {
  readonly limit: bigint;
  /** @internal */
  readonly leaseNs: bigint;
  override readonly name: string | undefined;

  constructor(options: LeaseOptions) {
    super();
    refuseUnknown(options, ["limit", "leaseMs", "name"], "Lease");
    if (options === undefined || options === null) throw badOption("Lease needs {limit, leaseMs}");
    this.limit = positive(options.limit, "limit");
    this.leaseNs = span(options.leaseMs, "lease");
    this.name = options.name === undefined ? undefined : checkName(options.name);
    Object.freeze(this);
  }
  override get capacity(): bigint {
    return this.limit;
  }
  get leaseMs(): number {
    return Number(this.leaseNs) / 1e6;
  }
  args(): string[] {
    return [this.limit.toString(), formatSeconds(this.leaseNs)];
  }
  head() {
    return "LEASE" as const;
  }
  ident(): string {
    return `L ${this.limit} ${this.leaseNs}\0${this.name ?? ""}`;
  }
  policyWindowMs(): undefined {
    return undefined;
  }
  override toString(): string {
    return `Lease(limit=${this.limit}, lease=${formatSeconds(this.leaseNs)}s)`;
  }
}

/** Any limit a limiter checks. */
export type Limit = GCRA | Window | Lease;

export function isLimit(v: unknown): v is Limit {
  return v instanceof GCRA || v instanceof Window || v instanceof Lease;
}

const UNITS: Record<string, number> = {
  s: 1,
  sec: 1,
  second: 1,
  seconds: 1,
  m: 60,
  min: 60,
  minute: 60,
  minutes: 60,
  h: 3600,
  hr: 3600,
  hour: 3600,
  hours: 3600,
  d: 86400,
  day: 86400,
  days: 86400,
};

/** The algorithm parseLimits gives each part: a window algorithm, or GCRA. */
export type StringAlgorithm = Algorithm | "GCRA";

function parseOne(part: string, algorithm: StringAlgorithm): GCRA | Window {
  const bad = (why: string) => invalid(`limit '${part}': ${why}`);
  const lower = part.trim().toLowerCase();
  const m = /^([0-9]*)(.*)$/s.exec(lower)!;
  const countText = m[1]!;
  let rest = m[2]!;
  if (countText === "") {
    throw bad("expected '<count>/<unit>' or '<count> per <unit>', starting with the count");
  }
  const count = BigInt(countText);
  if (count > U64_MAX) throw bad("the count does not fit in 64 bits");
  rest = rest.replace(/^[ \t]+/, "");
  if (rest.startsWith("/")) rest = rest.slice(1);
  else if (rest.startsWith("per")) rest = rest.slice(3);
  else throw bad("expected '/' or 'per' after the count, as in '10/minute' or '10 per minute'");
  const mm = /^([0-9]*)(.*)$/s.exec(rest.replace(/^[ \t]+/, ""))!;
  let multiplier = 1n;
  if (mm[1] !== "") {
    multiplier = BigInt(mm[1]!);
    if (multiplier === 0n || multiplier > U64_MAX)
      throw bad("the number of units must be a positive integer");
  }
  const unit = mm[2]!.trim();
  const secs = Object.prototype.hasOwnProperty.call(UNITS, unit) ? UNITS[unit] : undefined;
  if (secs === undefined) {
    throw bad(`unknown unit '${unit}' (s, sec, second(s), m, min, minute(s), h, hr, hour(s), d, day(s))`);
  }
  const window = multiplier * BigInt(secs);
  if (window > BigInt(MAX_SECONDS)) throw bad(`the window must be at most ${MAX_SECONDS} s`);
  const ms = Number(window) * 1000;
  try {
    if (algorithm === "GCRA") return new GCRA({ burst: count, rate: count, periodMs: ms });
    return new Window({ limit: count, windowMs: ms, algorithm });
  } catch (e) {
    throw bad((e as Error).message);
  }
}

/**
 * Reads limits as users write them: "10/minute", "100 per hour", "5/10s", several joined by
 * ';' or ',' ("20/minute; 200 per hour"). Each part is a SLIDING Window(count, multiplier ×
 * unit) unless another algorithm is asked for (GCRA is GCRA(count, count, window)), in the
 * order written (docs/clients.md#limit-strings). Errors name the bad part.
 */
export function parseLimits(text: string, algorithm: StringAlgorithm = "SLIDING"): (GCRA | Window)[] {
  if (typeof text !== "string" || text.trim() === "") throw invalid(`no limit in '${String(text)}'`);
  const alg: StringAlgorithm =
    typeof algorithm === "string" && algorithm.toUpperCase() === "GCRA" ? "GCRA" : parseAlgorithm(algorithm);
  const out: (GCRA | Window)[] = [];
  for (const raw of text.split(/[;,]/)) {
    const part = raw.trim();
    if (part === "") throw invalid(`empty limit in '${text}' (limits are separated by ';' or ',')`);
    out.push(parseOne(part, alg));
  }
  return out;
}
