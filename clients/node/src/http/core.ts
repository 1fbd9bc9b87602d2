// The framework-neutral HTTP core (docs/clients.md#web-middleware): request → rule → answer,
// under which the express middleware and the fastify plugin are thin adapters. Mirrors
// clients/go/rlhttp/middleware.go: rules of named limits keyed by the request's identities,
// exemptions, leases held for the request, the 429/413/503/401 answers, the RateLimit fields
// on admitted responses, and deductWhen settled on the status being sent.

import type { ServerResponse } from "node:http";
import { RateLimitConfigError, RedisUnavailableError, badOption, refuseUnknown, usage } from "../errors.js";
import type { Decision } from "../decision.js";
import { makeDecision } from "../decision.js";
import { decisionHeaders } from "../headers.js";
import { GCRA, Lease, Window, isLimit, parseLimits, toCount, type Limit } from "../limits.js";
import { RateLimiter, RateLimitedError } from "../limiter.js";
import type { LeaseHandle } from "../lease.js";
import { ClientIp, UNKNOWN_IP, type ClientIpOptions } from "./clientip.js";
import { identityKey, normalizeList } from "./keys.js";
import { matchPath, normalizePath } from "./paths.js";

export type Awaitable<T> = T | Promise<T>;

/** What the core needs to know of a request; each adapter builds it from its framework's request. */
export interface RequestView {
  readonly method: string;
  /** The request-target as sent (path and query), before any router rewrote it. */
  readonly target: string;
  /** The lines of a request header (lower-case name); none: []. */
  header(name: string): readonly string[];
  /** The socket peer's address (undefined: none, e.g. a Unix socket). */
  readonly peer: string | undefined;
  /** The client address the framework computed (express req.ip, fastify request.ip). */
  readonly frameworkIp?: string | undefined;
  /** The matched route template ("/users/:id"), where the framework knows it by now. */
  readonly route?: string | undefined;
  /** The router was asked: route undefined then means no route matched (a 404). */
  readonly routed?: boolean;
  /** The framework trusts proxies (express `trust proxy`, fastify `trustProxy`). */
  readonly frameworkTrustsProxies?: boolean;
}

/** What a key function found. @internal */
export interface Found {
  value: string | undefined;
  unusable?: boolean;
  unknown?: boolean;
}

/** A key function: the identity a limit counts by (its kind, part of every key) and its value. */
export interface Key<Req> {
  /** The identity kind written in the key ("ip", "hdr.x-api-key", "route", "user", "fn", ...). */
  readonly kind: string;
  /** @internal */
  readonly find: (req: Req, view: RequestView, ip: ClientIp) => Awaitable<Found>;
}

const KEY = Symbol("redis-rl.key");

function makeKey<Req>(kind: string, find: Key<Req>["find"]): Key<Req> {
  return Object.freeze({ kind, find, [KEY]: true });
}

function isKey(k: unknown): k is Key<unknown> {
  return typeof k === "object" && k !== null && (k as Record<symbol, unknown>)[KEY] === true;
}

function ipOf(view: RequestView, ip: ClientIp): Found {
  const a = ip.fromFramework
    ? ip.fromAddress(view.frameworkIp)
    : ip.resolve(view.peer, (n) => view.header(n));
  return { value: a.key, unusable: a.unusable, unknown: a.unknown };
}

/**
 * Keys by the client's address under the middleware's clientIp rule: kind "ip". A request
 * without a usable address counts in the one shared "unknown" bucket, never unlimited.
 */
export function ipKey<Req = unknown>(): Key<Req> {
  return makeKey("ip", (_req, view, ip) => ipOf(view, ip));
}

/**
 * Keys by a request header (every line, as one list), kind "hdr.<lower-case name>". An absent
 * or empty header is a missing identity (the rule's `missing`).
 */
export function headerKey<Req = unknown>(name: string): Key<Req> {
  if (typeof name !== "string" || !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) {
    throw badOption(`headerKey needs a header name, not ${JSON.stringify(name)}`);
  }
  const lower = name.toLowerCase();
  return makeKey("hdr." + lower, (_req, view) => {
    const lines = view.header(lower);
    if (lines.length === 0) return { value: undefined };
    const v = normalizeList(lines);
    return { value: v.replace(/^[, ]+|[, ]+$/g, "") === "" ? undefined : v };
  });
}

/**
 * Keys by the route, kind "route": one shared limit per endpoint. The router's matched
 * template where the framework knows it when the limiter runs (fastify always; express when
 * the middleware is mounted on the route itself, `app.get("/users/:id", limit, handler)`), a
 * request the router matched to no route as one "<METHOD> (no route)" bucket (fastify), else
 * the normalised path.
 */
export function routeKey<Req = unknown>(): Key<Req> {
  return makeKey("route", (_req, view) => {
    if (view.route !== undefined && view.route !== "") return { value: view.route };
    if (view.routed) return { value: `${view.method} (no route)` };
    return { value: normalizePath(view.target) };
  });
}

/** Keys by a function of the request (kind "fn" unless named; "user" for an authenticated user). */
export function fnKey<Req = unknown>(
  fn: (req: Req) => Awaitable<string | number | undefined | null>,
  kind = "fn",
): Key<Req> {
  if (typeof fn !== "function") throw badOption("fnKey needs a function of the request");
  if (typeof kind !== "string" || kind === "") throw badOption("fnKey's kind must be a non-empty string");
  return makeKey(kind, async (req) => {
    const v = await fn(req);
    if (v === undefined || v === null) return { value: undefined };
    const s = String(v);
    return { value: s === "" ? undefined : s };
  });
}

/** Keys by the authenticated user a function of the request gives: kind "user". */
export function userKey<Req = unknown>(
  fn: (req: Req) => Awaitable<string | number | undefined | null>,
): Key<Req> {
  return fnKey(fn, "user");
}

/** Limits as a rule takes them: a limit, several, or a limit string ("20/minute; 200 per hour"). */
export type LimitInput = Limit | readonly Limit[] | string;

/** One named limit (or several) of a rule, keyed by one identity. */
export interface LimitEntry<Req> {
  /** The bucket's name (in the key and the RateLimit fields); default the rule's name. */
  name?: string;
  /** The limit(s); several are named "<name>-<window seconds>s" unless they carry a name. */
  limit?: LimitInput;
  /**
   * Instead of limit: the limits of each request (the caller's plan), named the same way. An
   * error or nothing answers 500 {"error": "limiter_error", ...}; they cannot be checked when
   * the middleware is built, so give the entry a name of its own.
   */
  perRequest?: (req: Req) => Awaitable<LimitInput>;
  /** The identity the limit counts by (required: ipKey(), headerKey(name), routeKey(), userKey(fn), fnKey(fn)). */
  key: Key<Req>;
}

/** A rule: the requests it matches and the limits they are checked against, all or none charged. */
export interface Rule<Req> {
  /** Names the rule in errors, and its limits when they have no name of their own. */
  name?: string;
  /**
   * Path patterns on the normalised path (matchPath's syntax: a glob with `*`, a prefix ending
   * with `/`, else the exact path); none: every path.
   */
  path?: string | readonly string[];
  /** Only these methods (any case); none: every method. */
  methods?: readonly string[];
  /** Shorthand for one entry: limits keyed by `key`, named by the rule. */
  limit?: LimitInput;
  /** The key of the shorthand `limit`. */
  key?: Key<Req>;
  /** The rule's entries (besides or instead of the shorthand). */
  limits?: readonly LimitEntry<Req>[];
  /** Units each request costs (default 1). One of cost, costHeader, costFn. */
  cost?: number | bigint;
  /**
   * Each request's cost as the client declares it in this header: absent, empty or not a
   * decimal number is 1, 0 is 1, 2^64 or more can never pass (413, no Redis call).
   */
  costHeader?: string;
  /** Each request's cost: 0 is free (never let a client choose it); 2^64 or more, or Infinity, is 413 without a Redis call. */
  costFn?: (req: Req) => Awaitable<number | bigint>;
  /** A limit's identity missing: count under the client IP ("ip", default), 401 ("deny"), or skip the limit ("skip", counted). */
  missing?: "ip" | "deny" | "skip";
  /** The hash tag of every key of the rule (one RL.ALL on a Cluster). */
  hashTag?: string;
  /**
   * Decides on the status actually sent whether the request stays charged: false refunds it
   * (`(s) => s < 500` charges no server error). A client gone before a status was sent stays
   * charged (docs/clients.md#deduct_when).
   */
  deductWhen?: (status: number) => boolean;
}

/** Something the HTTP layer has to tell (no console output; warnings default to process.emitWarning once each). */
export type HttpEvent =
  | { type: "warning"; code: WarningCode; message: string }
  | { type: "error"; code: "limits" | "cost" | "key" | "limiter" | "settle"; rule: string; error: unknown };

/** Options of the HTTP core, which both middlewares take (validated when built: unknown ones refused). */
export interface HttpOptions<Req> {
  /** The rules, first match wins. */
  rules: readonly Rule<Req>[];
  /** Which client address ipKey() sees (default: the socket peer; see ClientIpOptions). */
  clientIp?: ClientIpOptions;
  /** Never limited (no Redis call, no fields): matchPath patterns on the normalised path. */
  exemptPaths?: readonly string[];
  /** Never limited when it returns true. */
  exempt?: (req: Req) => Awaitable<boolean>;
  /** Limit CORS preflights (OPTIONS with Origin and Access-Control-Request-Method) too; exempt by default. */
  limitPreflights?: boolean;
  /** Add X-RateLimit-Limit, -Remaining and -Reset. */
  xHeaders?: boolean;
  /** Told warnings and errors. */
  onEvent?: (event: HttpEvent) => void;
}

export const HTTP_OPTIONS = [
  "rules",
  "clientIp",
  "exemptPaths",
  "exempt",
  "limitPreflights",
  "xHeaders",
  "onEvent",
];
const RULE_OPTIONS = [
  "name",
  "path",
  "methods",
  "limit",
  "key",
  "limits",
  "cost",
  "costHeader",
  "costFn",
  "missing",
  "hashTag",
  "deductWhen",
];
const ENTRY_OPTIONS = ["name", "limit", "perRequest", "key"];

/** A refused request, as the denial handlers get it. */
export interface Denial {
  /** 429 (rate limited, or no free slot of a Lease), 413 (can never pass), 503 (the limiter could not decide), 401 (identity required). */
  readonly status: 429 | 413 | 503 | 401;
  /** The body's error: "rate_limited", "request_too_large", "limiter_unavailable", "identity_required". */
  readonly error: "rate_limited" | "request_too_large" | "limiter_unavailable" | "identity_required";
  /** The limiter's decision (undefined for a 401). */
  readonly decision: Decision | undefined;
  /** The binding limit's name. */
  readonly policy: string;
  /** The binding key as sent ("" when unknown). */
  readonly key: string;
  /** The fields to send: Retry-After, RateLimit-Policy, RateLimit (none for a 503 but Retry-After). */
  readonly headers: Readonly<Record<string, string>>;
  /** Retry-After in seconds, where the answer has one. */
  readonly retryAfter: number | undefined;
  /** The JSON body the default answer sends. */
  readonly body: string;
}

/** What an admitted request carries (req.rateLimit, request.rateLimit). */
export interface RateLimitInfo {
  /** The decision (combined, with each key's in perKey, when the rule has several limits). */
  readonly decision: Decision;
  /** The binding limit's name. */
  readonly policy: string;
  /** The binding key as sent. */
  readonly key: string;
  /** As express-rate-limit's req.rateLimit: the binding limit, what is left, what is used. */
  readonly limit: number;
  readonly remaining: number;
  readonly used: number;
  /** When the binding key is idle again. */
  readonly resetTime: Date;
  /** The lease the request holds under a Lease limit of that name (released when the request ends). */
  lease(name: string): LeaseHandle | undefined;
}

/** The core's answer for one request. */
export type Outcome =
  | { readonly kind: "pass" }
  | {
      readonly kind: "admit";
      readonly info: RateLimitInfo;
      readonly headers: Readonly<Record<string, string>>;
    }
  | { readonly kind: "deny"; readonly denial: Denial }
  | { readonly kind: "error"; readonly status: 500; readonly body: string; readonly error: unknown }
  | { readonly kind: "gone" };

const LIMITER_ERROR_BODY = '{"error": "limiter_error", "message": "the rate limiter failed"}';
const U64 = 1n << 64n;

interface Named {
  name: string;
  limit: Limit;
}

interface Entry<Req> {
  name: string;
  named: Named[] | undefined;
  perRequest: ((req: Req) => Awaitable<LimitInput>) | undefined;
  key: Key<Req>;
}

interface CompiledRule<Req> {
  name: string;
  paths: string[] | undefined;
  methods: string[] | undefined;
  entries: Entry<Req>[];
  cost: bigint;
  costHeader: string | undefined;
  costFn: ((req: Req) => Awaitable<number | bigint>) | undefined;
  missing: "ip" | "deny" | "skip";
  hashTag: string;
  deductWhen: ((status: number) => boolean) | undefined;
}

interface Check {
  key: string;
  full: string;
  name: string;
  limit: Limit;
}

function checkName(name: unknown, what: string): string {
  if (typeof name !== "string" || name === "" || !/^[\x20-\x7e]+$/.test(name)) {
    throw badOption(`${what}: a limit name must be non-empty printable ASCII, not ${JSON.stringify(name)}`);
  }
  return name;
}

function asLimits(input: LimitInput, what: string): Limit[] {
  if (typeof input === "string") return parseLimits(input);
  if (isLimit(input)) return [input];
  if (Array.isArray(input) && input.length > 0 && input.every(isLimit)) return [...input];
  throw badOption(
    `${what}: a limit is a GCRA, Window or Lease, an array of them, or a limit string such as "20/minute"`,
  );
}

/**
 * The limits of one entry, named: one is called by its own name or the entry's; several each
 * "<name>-<window seconds>s" (a Lease "<name>-0s"), with -2, -3 appended when two windows are
 * equal (docs/clients.md#names). A limit built with a name keeps it.
 */
export function namedLimits(name: string, limits: readonly Limit[]): { name: string; limit: Limit }[] {
  if (limits.length === 1) return [{ name: limits[0]!.name ?? name, limit: limits[0]! }];
  const seen = new Map<string, number>();
  return limits.map((l) => {
    let n = l.name;
    if (n === undefined) {
      const w = l.policyWindowMs();
      const secs = w === undefined ? 0 : Math.max(1, Math.ceil(w / 1000));
      n = `${name}-${secs}s`;
    }
    const k = (seen.get(n) ?? 0) + 1;
    seen.set(n, k);
    return { name: k > 1 ? `${n}-${k}` : n, limit: l };
  });
}

function positiveCount(v: unknown, what: string): bigint {
  const n = toCount(v);
  if (n === undefined || n === 0n) throw badOption(`${what} must be a positive integer`);
  return n;
}

function compileRule<Req>(r: Rule<Req>, i: number): CompiledRule<Req> {
  const label = r?.name ?? `rule ${i + 1}`;
  refuseUnknown(r, RULE_OPTIONS, `rule '${label}'`);
  if (!r || typeof r !== "object") throw badOption(`rule ${i + 1} must be an object`);
  if (r.name !== undefined) checkName(r.name, `rule ${i + 1}`);
  const where = `rule '${label}'`;
  let paths: string[] | undefined;
  if (r.path !== undefined) {
    paths = typeof r.path === "string" ? [r.path] : Array.isArray(r.path) ? [...r.path] : [];
    if (paths.length === 0 || paths.some((p) => typeof p !== "string" || p === "")) {
      throw badOption(`${where}: path must be a pattern or an array of patterns`);
    }
  }
  let methods: string[] | undefined;
  if (r.methods !== undefined) {
    if (!Array.isArray(r.methods) || r.methods.some((m) => typeof m !== "string" || m === "")) {
      throw badOption(`${where}: methods must be an array of method names`);
    }
    methods = r.methods.map((m: string) => m.toUpperCase());
  }
  const raw: LimitEntry<Req>[] = [];
  if (r.limit !== undefined || r.key !== undefined) {
    if (r.limit === undefined)
      throw badOption(`${where}: key is the key of the shorthand limit; give limit too`);
    raw.push({ limit: r.limit, key: r.key as Key<Req> });
  }
  if (r.limits !== undefined) {
    if (!Array.isArray(r.limits)) throw badOption(`${where}: limits must be an array of {name, limit, key}`);
    raw.push(...r.limits);
  }
  if (raw.length === 0) throw badOption(`${where} has no limit`);
  const entries = raw.map((e, j): Entry<Req> => {
    refuseUnknown(e, ENTRY_OPTIONS, `${where}'s limit ${j + 1}`);
    if (!e || typeof e !== "object") throw badOption(`${where}: limit ${j + 1} must be an object`);
    const nameGiven = e.name ?? r.name;
    if (nameGiven === undefined) {
      throw badOption(
        `${where}: limit ${j + 1} needs a name (name the rule or the limit: it names the bucket)`,
      );
    }
    const name = checkName(nameGiven, where);
    if (!isKey(e.key)) {
      throw badOption(
        `${where}: limit '${name}' needs a key: ipKey(), headerKey(name), routeKey(), userKey(fn) or fnKey(fn)`,
      );
    }
    if ((e.limit === undefined) === (e.perRequest === undefined)) {
      throw badOption(`${where}: limit '${name}' needs one of limit and perRequest`);
    }
    if (e.perRequest !== undefined && typeof e.perRequest !== "function") {
      throw badOption(`${where}: limit '${name}': perRequest must be a function of the request`);
    }
    let named: Named[] | undefined;
    if (e.limit !== undefined) {
      try {
        named = namedLimits(name, asLimits(e.limit, `${where}: limit '${name}'`));
      } catch (err) {
        if (err instanceof RateLimitConfigError && err.code === "ERR_RL_INVALID_LIMIT") {
          throw new RateLimitConfigError(err.code, `${where}: limit '${name}': ${err.message}`);
        }
        throw err;
      }
    }
    return { name, named, perRequest: e.perRequest, key: e.key };
  });
  const costs = [r.cost, r.costHeader, r.costFn].filter((c) => c !== undefined).length;
  if (costs > 1) throw badOption(`${where}: set one of cost, costHeader and costFn`);
  const cost = r.cost === undefined ? 1n : positiveCount(r.cost, `${where}: cost`);
  if (r.costHeader !== undefined && (typeof r.costHeader !== "string" || r.costHeader === "")) {
    throw badOption(`${where}: costHeader must be a header name`);
  }
  if (r.costFn !== undefined && typeof r.costFn !== "function")
    throw badOption(`${where}: costFn must be a function`);
  const missing = r.missing ?? "ip";
  if (!["ip", "deny", "skip"].includes(missing)) {
    throw badOption(`${where}: missing must be "ip", "deny" or "skip", not ${JSON.stringify(r.missing)}`);
  }
  const hashTag = r.hashTag ?? "";
  if (typeof hashTag !== "string" || /[{}]/.test(hashTag))
    throw badOption(`${where}: hashTag must hold no braces`);
  if (r.deductWhen !== undefined && typeof r.deductWhen !== "function") {
    throw badOption(`${where}: deductWhen must be a function of the status`);
  }
  return {
    name: label,
    paths,
    methods,
    entries,
    cost,
    costHeader: r.costHeader?.toLowerCase(),
    costFn: r.costFn,
    missing,
    hashTag,
    deductWhen: r.deductWhen,
  };
}

/**
 * Checks that one limit name is one bucket across rules: two rules that give one name to two
 * different limits are refused, naming both (docs/clients.md#limit-names-are-bucket-names).
 */
export function checkNames<Req>(
  rules: readonly CompiledRule<Req>[],
  seen = new Map<string, [string, string]>(),
): void {
  for (const r of rules) {
    for (const e of r.entries) {
      for (const n of e.named ?? []) {
        const prev = seen.get(n.name);
        const ident = n.limit.ident();
        if (prev && prev[1] !== ident) {
          throw badOption(
            `limit name '${n.name}' names two different limits, in ${prev[0]} and ${r.name}: one name is one bucket`,
          );
        }
        seen.set(n.name, [r.name, ident]);
      }
    }
  }
}

/** A client's declared cost (costHeader): absent, empty or not decimal is 1, 0 is 1, 2^64 or more never. */
export function headerCost(lines: readonly string[]): { cost: bigint; never: boolean } {
  const v = normalizeList(lines).replace(/^[ \t]+|[ \t]+$/g, "");
  if (v === "" || !/^[0-9]+$/.test(v)) return { cost: 1n, never: false };
  const n = BigInt(v);
  if (n >= U64) return { cost: 0n, never: true };
  return { cost: n === 0n ? 1n : n, never: false };
}

function jsonString(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (c < 0x20) out += "\\u" + c.toString(16).padStart(4, "0");
    else out += ch;
  }
  return out + '"';
}

function isPreflight(view: RequestView): boolean {
  return (
    view.method === "OPTIONS" &&
    view.header("origin").length > 0 &&
    view.header("access-control-request-method").length > 0
  );
}

function withLeases(d: Decision | undefined, held: Decision[]): Decision {
  if (d === undefined) {
    if (held.length === 1) return held[0]!;
    return makeDecision({ ...held[0]!, key: "", perKey: held });
  }
  const per = d.perKey && d.perKey.length > 0 ? d.perKey : [d];
  return makeDecision({ ...d, key: "", perKey: [...per, ...held] });
}

function bindingOf(d: Decision, names: Map<string, string>): [string, string] {
  const per = d.perKey ?? [];
  for (const p of per) if (!p.allowed && p.never === d.never) return [names.get(p.key) ?? "", p.key];
  for (const p of per) if (p.spec !== undefined && p.spec === d.spec) return [names.get(p.key) ?? "", p.key];
  if (per.length > 0) return [names.get(per[0]!.key) ?? "", per[0]!.key];
  return [names.get(d.key) ?? "default", d.key];
}

/** What the HTTP layer warns of, once each. */
export type WarningCode =
  "peer-unknown" | "framework-trusts-proxies" | "log-extra-left-out" | "reported-cost-saturated";

interface Settlement {
  reported: bigint | undefined;
  done: boolean;
}

const settlements = new WeakMap<object, Settlement>();

/**
 * Reports what the request really cost, in its rule's units (tokens, rows), before the
 * response's status is sent: on that status the charge is settled to it — what was charged
 * beyond it refunded (RL.REFUND), the extra recorded (FORCE, once per rate limit of the rule;
 * not on a LOG limit, which cannot record usage past its limit: left out, warned once). A
 * deductWhen that refuses the status refunds the whole charge instead. Leases are not
 * settled. `req` is the request the middleware saw (express's req, fastify's request). False
 * outside a limited request, or once the status is sent.
 */
export function reportCost(req: object, n: number | bigint): boolean {
  const st = settlements.get(req) ?? settlements.get((req as { raw?: object }).raw ?? {});
  if (!st || st.done) return false;
  const v = toCount(n);
  if (v === undefined) throw badOption(`reportCost needs a non-negative integer, not ${String(n)}`);
  st.reported = v;
  return true;
}

const U64_MAX = (1n << 64n) - 1n;
const DAY_NS = 86_400_000_000_000n;

/**
 * How many of extra reported units a FORCE on limit can record: all, unless the limit's
 * arithmetic cannot hold them (the server would answer "arithmetic overflow" and record
 * nothing). GCRA: the key's time may not pass 2^64 - 1 ns since the epoch (a day's margin for
 * the server's clock); a window's count may not pass 2^64 - 1.
 */
export function recordable(limit: Limit, extra: bigint, nowMs: number): bigint {
  if (limit instanceof GCRA) {
    const t = limit.intervalNs > 0n ? limit.intervalNs : 1n;
    const used = limit.burst * t + BigInt(Math.max(0, Math.floor(nowMs))) * 1_000_000n + DAY_NS;
    if (used > U64_MAX) return 0n;
    const most = (U64_MAX - used) / t;
    return extra < most ? extra : most;
  }
  if (limit instanceof Window) {
    const most = U64_MAX - limit.limit;
    return extra < most ? extra : most;
  }
  return extra;
}

/**
 * The framework-neutral HTTP limiter: the rules, exemptions and answers both middlewares
 * share. Build it once (its options are checked then); each adapter calls run() per request.
 */
export class HttpLimiter<Req = unknown> {
  readonly limiter: RateLimiter;
  readonly clientIp: ClientIp;
  private readonly rules: CompiledRule<Req>[];
  private readonly exemptPaths: string[];
  private readonly exempt: ((req: Req) => Awaitable<boolean>) | undefined;
  private readonly limitPreflights: boolean;
  private readonly xHeaders: boolean;
  private readonly onEvent: ((e: HttpEvent) => void) | undefined;
  private readonly warned = new Set<string>();
  /** @internal names checked so far, for rules added later (fastify's per-route rules). */
  readonly names = new Map<string, [string, string]>();

  constructor(
    limiter: RateLimiter,
    options: HttpOptions<Req>,
    extra: readonly string[] = [],
    what = "the rate-limit middleware",
  ) {
    if (!(limiter instanceof RateLimiter)) throw usage(`${what} needs a RateLimiter as its first argument`);
    refuseUnknown(options, [...HTTP_OPTIONS, ...extra], what);
    if (!options || typeof options !== "object") throw usage(`${what} needs options: {rules: [...]}`);
    if (!Array.isArray(options.rules)) throw badOption(`${what}: rules must be an array of rules`);
    this.limiter = limiter;
    this.clientIp = new ClientIp(options.clientIp ?? {});
    this.rules = options.rules.map((r, i) => compileRule(r, i));
    checkNames(this.rules, this.names);
    const ex = options.exemptPaths ?? [];
    if (!Array.isArray(ex) || ex.some((p) => typeof p !== "string" || p === "")) {
      throw badOption(`${what}: exemptPaths must be an array of path patterns`);
    }
    this.exemptPaths = [...ex];
    for (const f of ["exempt", "onEvent"] as const) {
      if (options[f] !== undefined && typeof options[f] !== "function")
        throw badOption(`${what}: ${f} must be a function`);
    }
    for (const f of ["limitPreflights", "xHeaders"] as const) {
      if (options[f] !== undefined && typeof options[f] !== "boolean")
        throw badOption(`${what}: ${f} must be a boolean`);
    }
    this.exempt = options.exempt;
    this.limitPreflights = options.limitPreflights === true;
    this.xHeaders = options.xHeaders === true;
    this.onEvent = options.onEvent;
  }

  /** Compiles more rules against the same names (a fastify route's own rules). @internal */
  compile(rules: readonly Rule<Req>[], label: string): CompiledRule<Req>[] {
    if (!Array.isArray(rules)) throw badOption(`${label}: rules must be an array of rules`);
    const out = rules.map((r, i) => {
      const c = compileRule(r, i);
      if (r.name === undefined) c.name = `${label} rule ${i + 1}`;
      return c;
    });
    checkNames(out, this.names);
    return out;
  }

  private emit(e: HttpEvent): void {
    if (this.onEvent) {
      try {
        this.onEvent(e);
      } catch {
        // an events hook must not break a request
      }
    } else if (e.type === "warning") {
      process.emitWarning(e.message, { code: "REDIS_RL_" + e.code.toUpperCase().replace(/-/g, "_") });
    }
  }

  private warnOnce(code: WarningCode, message: string): void {
    if (this.warned.has(code)) return;
    this.warned.add(code);
    this.emit({ type: "warning", code, message });
  }

  /**
   * Whether the request is exempt by path. Rules and exemptions match the normalised path,
   * dot segments resolved, as in the other packages (docs/clients.md#routes): `/static/../api`
   * is `/api`, the path a resolving router serves.
   */
  private exemptByPath(path: string): boolean {
    return this.exemptPaths.some((x) => matchPath(x, path));
  }

  private ruleFor(rules: readonly CompiledRule<Req>[], view: RequestView, path: string) {
    const method = view.method.toUpperCase();
    return rules.find((r) => {
      if (r.methods && !r.methods.includes(method)) return false;
      if (!r.paths) return true;
      return r.paths.some((p) => matchPath(p, path));
    });
  }

  /**
   * Decides one request and binds its settlement to res: deductWhen on the status being sent
   * (res.writeHead), its leases released when res closes (finished, or the client gone).
   * `rules` replaces the middleware's rules (a fastify route's own).
   */
  async run(
    req: Req,
    view: RequestView,
    res: ServerResponse,
    rules?: readonly CompiledRule<Req>[],
  ): Promise<Outcome> {
    if (!this.limitPreflights && isPreflight(view)) return { kind: "pass" };
    try {
      if (this.exempt && (await this.exempt(req))) return { kind: "pass" };
    } catch (error) {
      this.emit({ type: "error", code: "key", rule: "exempt", error });
      return { kind: "error", status: 500, body: LIMITER_ERROR_BODY, error };
    }
    const path = normalizePath(view.target);
    if (this.exemptPaths.length > 0 && this.exemptByPath(path)) return { kind: "pass" };
    const rule = this.ruleFor(rules ?? this.rules, view, path);
    if (!rule) return { kind: "pass" };
    return this.decide(rule, req, view, res);
  }

  private async decide(
    rule: CompiledRule<Req>,
    req: Req,
    view: RequestView,
    res: ServerResponse,
  ): Promise<Outcome> {
    const counters = this.limiter.counter;
    if (!this.clientIp.fromFramework && !this.clientIp.trustsProxies && view.frameworkTrustsProxies) {
      this.warnOnce(
        "framework-trusts-proxies",
        "redis-rl: the framework trusts proxies (express `trust proxy`, fastify `trustProxy`) but the limiter's clientIp trusts none, so ipKey() keys by the socket peer (the proxy): give clientIp {fromFramework: true} to use req.ip, or the same trustedProxies",
      );
    }
    const rates: Check[] = [];
    const leases: Check[] = [];
    let unusable = false;
    let unknown = false;
    const countAddress = () => {
      if (unusable) counters.add("forwardedUnusable");
      if (unknown) {
        counters.add("peerUnknown");
        this.warnOnce(
          "peer-unknown",
          `redis-rl: a request with no usable client address (no IP peer, e.g. a Unix socket, and no trusted forwarding header): its IP limits count in the one bucket shared by all such requests, ip:${UNKNOWN_IP} (counted peerUnknown, warned once). Behind a proxy on a Unix socket, trust it with clientIp {trustedProxies: ["unix"]}`,
        );
      }
    };
    const fail = (code: "limits" | "cost" | "key" | "limiter", error: unknown): Outcome => {
      this.emit({ type: "error", code, rule: rule.name, error });
      counters.add("errors");
      return { kind: "error", status: 500, body: LIMITER_ERROR_BODY, error };
    };
    for (const entry of rule.entries) {
      let named = entry.named;
      if (!named) {
        try {
          const got = await entry.perRequest!(req);
          if (got === undefined || got === null) throw new Error("none given");
          named = namedLimits(entry.name, asLimits(got, `the limits of '${entry.name}' for this request`));
        } catch (error) {
          return fail("limits", error);
        }
      }
      let found: Found;
      try {
        found = await entry.key.find(req, view, this.clientIp);
      } catch (error) {
        return fail("key", error);
      }
      let kind = entry.key.kind;
      if (found.value === undefined) {
        if (rule.missing === "deny") {
          countAddress();
          counters.add("missingDenied");
          return { kind: "deny", denial: this.identityRequired(entry.name) };
        }
        if (rule.missing === "skip") {
          counters.add("skipped", named.length);
          continue;
        }
        found = ipOf(view, this.clientIp);
        kind = "ip";
      }
      unusable ||= found.unusable === true;
      unknown ||= found.unknown === true;
      for (const n of named) {
        const key = identityKey(n.name, kind, found.value!, rule.hashTag);
        const c = { key, full: this.limiter.prefix + key, name: n.name, limit: n.limit };
        (n.limit instanceof Lease ? leases : rates).push(c);
      }
    }
    countAddress();
    const all = [...rates, ...leases];
    if (all.length === 0) return { kind: "pass" };
    const names = new Map(all.map((c) => [c.full, c.name]));
    let cost: bigint;
    let never = false;
    try {
      [cost, never] = await this.costOf(rule, req, view);
    } catch (error) {
      return fail("cost", error);
    }
    if (never) {
      const first = all[0]!;
      const d = makeDecision({
        allowed: false,
        never: true,
        retryAfterMs: Infinity,
        source: "local",
        blind: true,
        spec: first.limit,
        key: first.full,
        limit: Number(first.limit.capacity),
      });
      counters.add("denied");
      return this.refuse(d, first.name, first.full, decisionHeaders(d)); // no fields: Redis was not asked
    }
    // The client going away abandons the decision; a lease taken meanwhile is released.
    const controller = new AbortController();
    let closed = false;
    const onClose = () => {
      closed = true;
      if (!res.writableFinished) controller.abort(new Error("the client went away"));
    };
    res.once("close", onClose);
    const signal = controller.signal;
    const guards: LeaseHandle[] = [];
    const held: Decision[] = [];
    const release = () => {
      for (const g of guards.splice(0)) {
        g.release().catch((error) => this.emit({ type: "error", code: "settle", rule: rule.name, error }));
      }
    };
    const finish = (o: Outcome): Outcome => {
      res.removeListener("close", onClose);
      if (o.kind !== "admit") release();
      return o;
    };
    // Leases first: a request that finds no free slot is charged nothing anywhere.
    for (const c of leases) {
      try {
        const g = await this.limiter.acquire(c.key, c.limit as Lease, { signal });
        guards.push(g);
        held.push(g.decision);
      } catch (error) {
        if (error instanceof RateLimitedError) {
          const d =
            error.decision.key === "" ? makeDecision({ ...error.decision, key: c.full }) : error.decision;
          return finish(this.refuse(d, c.name, c.full, decisionHeaders(d, this.headerOptions(c.name))));
        }
        if (error instanceof RedisUnavailableError) {
          const d = makeDecision({
            allowed: false,
            degraded: true,
            blind: true,
            retryAfterMs: 1000,
            source: "local",
            key: c.full,
          });
          return finish(this.refuse(d, c.name, c.full, decisionHeaders(d)));
        }
        if (signal.aborted || closed) return finish({ kind: "gone" });
        return finish(fail("limiter", error));
      }
    }
    if (closed) return finish({ kind: "gone" });
    let d: Decision | undefined;
    if (rates.length > 0) {
      try {
        d =
          rates.length === 1
            ? await this.limiter.check(rates[0]!.key, rates[0]!.limit, { cost, signal })
            : await this.limiter.checkAll(
                rates.map((c) => [c.key, c.limit] as const),
                { cost, signal, acrossSlots: true },
              );
      } catch (error) {
        if (error instanceof RedisUnavailableError) {
          d = makeDecision({
            allowed: false,
            degraded: true,
            blind: true,
            retryAfterMs: 1000,
            source: "local",
          });
        } else if (signal.aborted || closed) return finish({ kind: "gone" });
        else return finish(fail("limiter", error));
      }
    }
    const charged = d; // the rate limits' decision: each limit is settled by its own (perKey)
    if (held.length > 0 && (d === undefined || d.allowed)) d = withLeases(d, held);
    const first = all[0]!;
    const h = decisionHeaders(d!, { ...this.headerOptions(first.name), names: Object.fromEntries(names) });
    let [policy, bkey] = [first.name, d!.key || first.full];
    if (d!.perKey && d!.perKey.length > 0) [policy, bkey] = bindingOf(d!, names);
    if (!d!.allowed) return finish(this.refuse(d!, policy, bkey, h));
    res.removeListener("close", onClose);
    this.bind(req, res, rule, rates, cost, charged ?? d!, guards);
    const byName = new Map<string, LeaseHandle>();
    guards.forEach((g, i) => byName.set(leases[i]!.name, g));
    const decision = d!;
    const info: RateLimitInfo = Object.freeze({
      decision,
      policy,
      key: bkey,
      limit: decision.limit,
      remaining: decision.remaining,
      used: Math.max(0, decision.limit - decision.remaining),
      resetTime: new Date(Date.now() + decision.resetAfterMs),
      lease: (name: string) => byName.get(name),
    });
    return { kind: "admit", info, headers: h };
  }

  private headerOptions(name: string) {
    return { policyName: name, xHeaders: this.xHeaders };
  }

  private async costOf(rule: CompiledRule<Req>, req: Req, view: RequestView): Promise<[bigint, boolean]> {
    if (rule.costFn) {
      const v = await rule.costFn(req);
      if (v === Infinity) return [0n, true];
      const n = toCount(v);
      if (n === undefined)
        throw badOption(`costFn of ${rule.name} returned ${String(v)}, not a non-negative integer`);
      if (n >= U64) return [0n, true];
      return [n, false];
    }
    if (rule.costHeader) {
      const c = headerCost(view.header(rule.costHeader));
      return [c.cost, c.never];
    }
    return [rule.cost, false];
  }

  /**
   * Settles the request on the status being sent (deductWhen refunds its charge), and
   * releases its leases when the response closes: finished, or the client gone (a handler that
   * failed ends in the framework's error answer, which closes it too).
   */
  private bind(
    req: Req,
    res: ServerResponse,
    rule: CompiledRule<Req>,
    rates: Check[],
    cost: bigint,
    d: Decision,
    guards: LeaseHandle[],
  ): void {
    if (guards.length > 0) {
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        for (const g of guards) {
          g.release().catch((error) => this.emit({ type: "error", code: "settle", rule: rule.name, error }));
        }
      };
      if (res.closed || res.destroyed) release();
      else {
        res.once("close", release);
        res.once("finish", release);
      }
    }
    if (rates.length === 0 || (d.degraded && d.blind)) return; // open or closed: nothing was charged
    const deduct = rule.deductWhen;
    const st: Settlement = { reported: undefined, done: false };
    settlements.set(req as object, st);
    const settle = (status: number) => {
      if (st.done) return;
      st.done = true;
      let keep = true;
      if (deduct) {
        try {
          keep = deduct(status) !== false;
        } catch (error) {
          this.emit({ type: "error", code: "settle", rule: rule.name, error });
        }
      }
      const failed = (error: unknown) => this.emit({ type: "error", code: "settle", rule: rule.name, error });
      // Each limit is given back where its own decision took the charge (Redis, or the local
      // policy's memory during an outage, also once Redis answers again): refundDecision.
      const giveBack = (n: bigint) =>
        rates.forEach((_, i) => {
          const own = rates.length === 1 ? d : d.perKey?.[i];
          if (own) this.limiter.refundDecision(own, n).catch(failed);
        });
      const reported = st.reported;
      if (!keep) {
        if (cost > 0n) giveBack(cost);
      } else if (reported !== undefined && reported > cost) {
        for (const c of rates) this.force(c, reported - cost).catch(failed);
      } else if (reported !== undefined && reported < cost) {
        giveBack(cost - reported);
      }
    };
    const writeHead = res.writeHead;
    res.writeHead = function (this: ServerResponse, status: number, ...rest: unknown[]) {
      if (status >= 200) settle(status); // a 1xx informational answer is not the status
      return (writeHead as (...a: unknown[]) => ServerResponse).call(this, status, ...rest);
    } as typeof res.writeHead;
  }

  /**
   * Records extra reported units on c's key (RL.GCRA / RL.WINDOW ... FORCE): on a LOG limit it
   * cannot (FORCE refuses LOG), so they are left out, warned once; beyond what the limit's
   * arithmetic holds, the most it holds is recorded, counted in errors and warned once
   * (docs/clients.md#costs-and-settlement).
   */
  private async force(c: Check, extra: bigint): Promise<void> {
    if (c.limit instanceof Window && c.limit.algorithm === "LOG") {
      this.warnOnce(
        "log-extra-left-out",
        `redis-rl: a reported cost above the charge is not recorded on a LOG limit (LOG cannot record usage past its limit): ${c.full}`,
      );
      return;
    }
    const n = recordable(c.limit, extra, Date.now());
    let short = n < extra;
    if (short) {
      this.warnOnce(
        "reported-cost-saturated",
        `redis-rl: a reported cost beyond what the limit's arithmetic holds is recorded as the most it holds (the key is used up as long as it can be); counted in errors: ${c.full}`,
      );
    }
    if (n > 0n) {
      try {
        await this.limiter.check(c.key, c.limit, { cost: n, force: true });
      } catch (error) {
        short = true;
        this.emit({ type: "error", code: "settle", rule: "reportCost", error });
      }
    }
    if (short) this.limiter.counter.add("errors");
  }

  private identityRequired(policy: string): Denial {
    return Object.freeze({
      status: 401,
      error: "identity_required",
      decision: undefined,
      policy,
      key: "",
      headers: {},
      retryAfter: undefined,
      body: `{"error": "identity_required", "message": "this request must identify itself (e.g. with an API key) to be served", "policy": ${jsonString(policy)}}`,
    } as const);
  }

  /** A denied request: 413 (can never pass), 503 (the limiter could not decide) or 429. */
  private refuse(d: Decision, policy: string, key: string, headers: Record<string, string>): Outcome {
    const retryText = headers["Retry-After"];
    const retryAfter = retryText === undefined ? undefined : Number(retryText);
    let denial: Denial;
    if (d.never) {
      denial = {
        status: 413,
        error: "request_too_large",
        decision: d,
        policy,
        key,
        headers,
        retryAfter,
        body: `{"error": "request_too_large", "message": "this request asks for more than the limit allows and can never pass", "policy": ${jsonString(policy)}}`,
      };
    } else if (d.blind) {
      denial = {
        status: 503,
        error: "limiter_unavailable",
        decision: d,
        policy,
        key,
        headers,
        retryAfter,
        body: `{"error": "limiter_unavailable", "message": "the rate limiter is unavailable; retry shortly", "retry_after": ${retryText ?? "null"}}`,
      };
    } else {
      denial = {
        status: 429,
        error: "rate_limited",
        decision: d,
        policy,
        key,
        headers,
        retryAfter,
        body: `{"error": "rate_limited", "message": "too many requests", "policy": ${jsonString(policy)}, "retry_after": ${retryText ?? "1"}}`,
      };
    }
    return { kind: "deny", denial: Object.freeze(denial) };
  }
}

/** Sends a denial as the default answer does: its fields, the status, the JSON body. */
export function sendDenial(res: ServerResponse, denial: Denial): void {
  for (const [k, v] of Object.entries(denial.headers)) res.setHeader(k, v);
  res.setHeader("Content-Type", "application/json");
  res.setHeader("Content-Length", Buffer.byteLength(denial.body));
  res.statusCode = denial.status;
  res.end(denial.body);
}

/** Sends the 500 of a limiter, limit, key or cost function that failed. */
export function sendLimiterError(res: ServerResponse, body: string): void {
  res.setHeader("Content-Type", "application/json");
  res.setHeader("Content-Length", Buffer.byteLength(body));
  res.statusCode = 500;
  res.end(body);
}

/** A request's header lines, from node:http's IncomingMessage (headersDistinct where Node has it). */
export function headerLines(msg: {
  headers: Record<string, string | string[] | undefined>;
  headersDistinct?: Record<string, string[] | undefined>;
}): (name: string) => readonly string[] {
  return (name) => {
    const d = msg.headersDistinct?.[name];
    if (d) return d;
    const v = msg.headers[name];
    if (v === undefined) return [];
    return Array.isArray(v) ? v : [v];
  };
}
