// The limiter: decisions made in Redis, shared by every process of a service. Mirrors
// clients/go/client.go (detection, the library plan, scripts, the OOM twin, the call loop),
// with promises and AbortSignal in place of context.Context.

import {
  LibraryError,
  RateLimitConfigError,
  RedisReplyError,
  RedisTimeoutError,
  badOption,
  describe,
  invalid,
  refuseUnknown,
  usage,
} from "./errors.js";
import {
  allReply,
  binding,
  combine,
  fromReply,
  ints,
  makeDecision,
  ProtocolError,
  type Decision,
  type Refunded,
} from "./decision.js";
import {
  GCRA,
  Lease,
  Window,
  checkToken,
  countError,
  isLimit,
  toCount,
  type Limit,
  MAX_SECONDS,
} from "./limits.js";
import { LIBRARY_NAME, LIBRARY_VERSION, LUA_LIBRARY_TEXT, SCRIPT_SHA, SCRIPT_TEXT } from "./lua.js";
import {
  Counters,
  Health,
  type CounterName,
  type CounterSnapshot,
  type FailurePolicy,
  type LimiterEvent,
} from "./policy.js";
import {
  commandExists,
  configuredCode,
  errorCode,
  frame,
  isConnectionLevel,
  isMissingFunction,
  isNoScript,
  isOOM,
  isRedirect,
  isRefused,
  isUnavailable,
  isUnknownCommand,
  listedLibrary,
  planFor,
  serverError,
  twinName,
  type Mode,
  type Op,
  type ScriptCall,
} from "./protocol.js";
import { slotGroups } from "./slots.js";
import { transportFor, type NodeHandle, type SendCommand, type Transport } from "./transport.js";
import { LeaseHandle, newToken } from "./lease.js";
import { DenyCache } from "./denycache.js";
import { LocalLimits, localDecision, localRefunded } from "./local.js";
import { Batcher, denialForCost, now as batchNow } from "./batch.js";

/** Options of RateLimiter (validated when it is built: an unknown one is refused). */
export interface RateLimiterOptions {
  /** An ioredis Redis or Cluster, or a connected node-redis client or cluster. */
  client?: unknown;
  /** Instead of client: one send-function, `(args) => client.sendCommand(args)` (one server). */
  sendCommand?: SendCommand;
  /** "auto" (default: asks the server once), "module" or "fallback". */
  mode?: Mode;
  /**
   * The failure policy: "open" (default), "closed", "raise", or "local": while Redis does not
   * answer, this process enforces the same limits in memory (docs/clients.md#failure-policy-local).
   */
  onError?: FailurePolicy;
  /**
   * Under "local": how many processes share the limits. While Redis is down each process
   * enforces each limit divided by it (rounding down, at least 1: GCRA's burst and rate, a
   * window's or a lease's limit), so the fleet stays near the limit. 1 by default.
   */
  fleetSize?: number;
  /**
   * Batching (off by default; 1 is off): a plain check takes up to this many units in one
   * call (QUANTITY k), admits the following requests of the same key and limit from them in
   * this process without a call (source "local", counted allowedLocally), and gives back
   * what is left after batchHoldMs, or on close(). Every local admission was paid for in
   * Redis first, so the fleet never admits more than the limit; up to k - 1 units per
   * process may sit unused for the hold (docs/clients.md#batching-optional). Not batched: LOG
   * windows, leases, checkAll, and checks with peek, force, maxWaitMs, or a cost of k or more.
   */
  batch?: number;
  /** How long unused batch units are held before they are given back (100 ms). */
  batchHoldMs?: number;
  /** Prepended to every key sent (no braces: it would become the hash tag). */
  prefix?: string;
  /** Bounds each Redis call (500 ms by default): running out of it is an outage. */
  timeoutMs?: number;
  /** After a failed call, how long checks are answered by the policy without trying Redis (1000 ms). */
  probeIntervalMs?: number;
  /** The retryAfterMs of the closed policy's denials (1000 ms). */
  closedRetryAfterMs?: number;
  /** Allow (default) loading the Lua library with FUNCTION LOAD when it is missing or older. */
  loadLibrary?: boolean;
  /**
   * The local deny cache (default on): after Redis denies a key and limit with retryAfterMs
   * r, checks of the same key and limit for at least that cost inside r are denied here
   * without a round trip (source "local", counted deniedLocally). It never admits anything
   * Redis would deny (docs/clients.md#local-deny-cache).
   */
  denyCache?: boolean;
  /** Called as onCounter(name, n) on every counter increment (for a metrics library). */
  onCounter?: (name: CounterName, n: number) => void;
  /** Called with what the limiter has to tell (an outage, a recovery, a library loaded, ...). */
  onEvent?: (event: LimiterEvent) => void;
}

const LIMITER_OPTIONS = [
  "client",
  "sendCommand",
  "mode",
  "onError",
  "prefix",
  "timeoutMs",
  "probeIntervalMs",
  "closedRetryAfterMs",
  "loadLibrary",
  "denyCache",
  "fleetSize",
  "batch",
  "batchHoldMs",
  "onCounter",
  "onEvent",
] as const;

/** Options of check. */
export interface CheckOptions {
  /** Units this request costs (default 1; 0 only reports the key's state). */
  cost?: number | bigint;
  /** Evaluate exactly as a real request and write nothing. */
  peek?: boolean;
  /** Record usage that already happened, allowed or not (not for LOG). */
  force?: boolean;
  /** GCRA only: admit now a request that would be allowed within this many ms (a reservation). */
  maxWaitMs?: number;
  /** Abandons the call: it rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Options of checkAll. */
export interface CheckAllOptions {
  /** The cost of every entry without its own (default 1). */
  cost?: number | bigint;
  peek?: boolean;
  force?: boolean;
  /**
   * On a Redis Cluster, let the keys be in several slots: the limits are checked one slot
   * group at a time, in entry order (one RL.ALL each), and when a later group denies, what the
   * earlier groups took is given back (RL.REFUND of exactly the charge; a lease is released),
   * so a denied request leaves no charge; the later groups are then peeked, and the decision
   * is combined as RL.ALL combines. Not atomic: meanwhile another request may see the earlier
   * limits charged (it can only be denied for it, never admitted past a limit). Without it,
   * keys in several slots are the server's CROSSSLOT error. Keys in one slot, and every call
   * on one server, are one RL.ALL whatever this says (docs/clients.md#identities-stay-apart).
   */
  acrossSlots?: boolean;
  signal?: AbortSignal;
}

/** One limit of a checkAll with its own cost (RL.ALL's COST) or, for a Lease, its token. */
export interface EntrySpec {
  limit: Limit;
  cost?: number | bigint;
  token?: string;
}

/** checkAll's entries: an object (property order), a Map or an array of [key, limit] pairs. */
export type Entries =
  | Readonly<Record<string, Limit | EntrySpec>>
  | ReadonlyMap<string, Limit | EntrySpec>
  | ReadonlyArray<readonly [string, Limit | EntrySpec]>;

/** Options of acquire. */
export interface AcquireOptions {
  /** The holder's name (1 to 64 bytes; default 32 random hex digits). The same token renews. */
  token?: string;
  /** Slots taken at once (default 1). */
  slots?: number | bigint;
  signal?: AbortSignal;
}

class Down extends Error {
  constructor(override readonly cause: unknown) {
    super(`redis-rl: outage: ${describe(cause)}`);
  }
}

interface Entry {
  key: string;
  full: string;
  limit: Limit;
  cost: bigint | undefined;
  token: string | undefined;
}

/**
 * The combinations the module refuses (docs/reference.md#r-force-3), refused here before any
 * call so that every mode (module, fallback, memory) answers them alike, with its messages.
 */
function refuseConflicts(limit: Limit, peek: boolean, force: boolean, maxWait: boolean): void {
  if (!force) return;
  if (peek) throw usage("FORCE cannot be used with PEEK: FORCE records usage, PEEK records nothing");
  if (maxWait) {
    throw usage(
      "FORCE cannot be used with MAXWAIT: FORCE records usage that already happened, MAXWAIT reserves a later start",
    );
  }
  if (limit instanceof Lease) {
    throw usage(
      "FORCE cannot be used on a LEASE limit: its slots are taken with RL.LEASE and given back with RL.RELEASE",
    );
  }
  if (limit instanceof Window && limit.algorithm === "LOG") {
    throw usage(
      "FORCE cannot be used with LOG: a LOG records each admitted request and never holds more than its limit; use FIXED or SLIDING to record usage after the fact",
    );
  }
}

function cost(v: unknown, name: string): bigint {
  const n = toCount(v);
  if (n === undefined) throw countError(v, name, "non-negative");
  return n;
}

function duration(v: unknown, name: string, dflt: number): number {
  if (v === undefined) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0 || v > MAX_SECONDS * 1000) {
    throw badOption(`${name} must be a positive number of milliseconds of at most ${MAX_SECONDS} s`);
  }
  return v;
}

/** Rejects with the signal's reason when it is aborted. */
function checkSignal(signal: AbortSignal | undefined): void {
  if (signal === undefined) return;
  if (!(signal instanceof AbortSignal)) throw badOption("signal must be an AbortSignal");
  signal.throwIfAborted();
}

/**
 * Makes rate-limit decisions in Redis, shared by every process of a service: the redis-rl
 * module's commands when the server has them, else the project's Lua library (the same
 * replies). When Redis does not answer, the failure policy does.
 */
export class RateLimiter {
  /** @internal */
  readonly transport: Transport;
  readonly mode: Mode;
  readonly prefix: string;
  readonly timeoutMs: number;
  readonly loadLibrary: boolean;
  /** @internal */
  readonly health: Health;
  /** @internal */
  readonly counter: Counters;
  private readonly onEvent: ((e: LimiterEvent) => void) | undefined;
  private readonly denials: DenyCache | undefined;
  /** @internal The in-memory limits of the "local" policy (undefined under the others). */
  readonly local: LocalLimits | undefined;
  /** @internal Batch credits (undefined without batching). */
  readonly batcher: Batcher | undefined;

  private resolved: "module" | "fallback" | undefined;
  private detecting: Promise<"module" | "fallback"> | undefined;
  private libraryReady = false;
  private preparing: Promise<void> | undefined;
  // The fallback runs as a script (no Functions library here): EVAL first, EVALSHA once a
  // server was sent the text; evalRefused: SCRIPT LOAD + EVALSHA; evalshaRefused: EVAL always.
  private scripts = false;
  private scriptCached = false;
  private evalRefused = false;
  private evalshaRefused = false;

  constructor(options: RateLimiterOptions) {
    refuseUnknown(options, LIMITER_OPTIONS, "RateLimiter");
    if (options === undefined || options === null) throw usage("RateLimiter needs options: {client}");
    const mode = options.mode ?? "auto";
    if (!["auto", "module", "fallback"].includes(mode)) {
      throw badOption(`mode must be "auto", "module" or "fallback", not ${JSON.stringify(mode)}`);
    }
    const policy = options.onError ?? "open";
    if (!["open", "closed", "raise", "local"].includes(policy)) {
      throw badOption(`onError must be "open", "closed", "raise" or "local", not ${JSON.stringify(policy)}`);
    }
    const fleet = options.fleetSize ?? 1;
    if (typeof fleet !== "number" || !Number.isSafeInteger(fleet) || fleet < 1) {
      throw badOption(
        "fleetSize must be an integer of at least 1 (the number of processes sharing the limits)",
      );
    }
    const batch = options.batch;
    if (batch !== undefined && (typeof batch !== "number" || !Number.isSafeInteger(batch) || batch < 1)) {
      throw invalid("batch must be a positive integer");
    }
    const prefix = options.prefix ?? "";
    if (typeof prefix !== "string" || /[{}]/.test(prefix)) {
      throw badOption("prefix must be a string without '{' or '}' (it would become the hash tag)");
    }
    for (const f of ["loadLibrary", "denyCache"] as const) {
      if (options[f] !== undefined && typeof options[f] !== "boolean")
        throw badOption(`${f} must be a boolean`);
    }
    for (const f of ["onCounter", "onEvent"] as const) {
      if (options[f] !== undefined && typeof options[f] !== "function")
        throw badOption(`${f} must be a function`);
    }
    this.timeoutMs = duration(options.timeoutMs, "timeoutMs", 500);
    const probe = duration(options.probeIntervalMs, "probeIntervalMs", 1000);
    const closed = duration(options.closedRetryAfterMs, "closedRetryAfterMs", 1000);
    const hold = duration(options.batchHoldMs, "batchHoldMs", 100);
    this.transport = transportFor(options.client, options.sendCommand);
    this.mode = mode;
    this.prefix = prefix;
    this.loadLibrary = options.loadLibrary ?? true;
    this.onEvent = options.onEvent;
    this.denials = options.denyCache === false ? undefined : new DenyCache(10_000);
    this.counter = new Counters(options.onCounter);
    this.local = policy === "local" ? new LocalLimits(BigInt(fleet)) : undefined;
    this.batcher = batch !== undefined && batch > 1 ? new Batcher(BigInt(batch), hold) : undefined;
    this.health = new Health(policy, probe, closed, (e) => this.emit(e));
  }

  /** The failure policy. */
  get onError(): FailurePolicy {
    return this.health.policy;
  }

  /** Whether the client is a Redis Cluster client. */
  get isCluster(): boolean {
    return this.transport.cluster;
  }

  /** Every counter by name (docs/clients.md#counters). */
  get counters(): CounterSnapshot {
    return this.counter.snapshot();
  }

  /** @internal */
  emit(e: LimiterEvent): void {
    if (!this.onEvent) return;
    try {
      this.onEvent(e);
    } catch {
      // an events hook must not break a decision
    }
  }

  /** The mode in use ("module" or "fallback"), detecting it if needed (and loading the library). */
  async resolvedMode(options: { signal?: AbortSignal } = {}): Promise<"module" | "fallback"> {
    refuseUnknown(options, ["signal"], "resolvedMode");
    return this.modeNow(options.signal);
  }

  // -- decisions ---------------------------------------------------------------------------

  /**
   * Whether one request (cost 1 unless `cost`) of `limit` on `key` may go ahead now, and takes
   * it (RL.GCRA or RL.WINDOW). Rejects on an invalid call (RateLimitConfigError), an error
   * reply that is not an outage (RedisReplyError: WRONGTYPE, a server-side cap), an abort (the
   * signal's reason), and under "raise" an outage (RedisUnavailableError).
   */
  async check(key: string, limit: Limit, options: CheckOptions = {}): Promise<Decision> {
    refuseUnknown(options, ["cost", "peek", "force", "maxWaitMs", "signal"], "check");
    if (!isLimit(limit)) throw usage("check needs a limit (GCRA, Window)");
    if (limit instanceof Lease) throw usage("a Lease is taken with acquire, not check");
    const c = options.cost === undefined ? 1n : cost(options.cost, "cost");
    const wait = options.maxWaitMs;
    if (wait !== undefined) {
      if (!(limit instanceof GCRA)) throw usage("maxWaitMs (MAXWAIT) is offered by GCRA limits only");
      // MAXWAIT is whole milliseconds (docs/reference.md#r-arg-2): a fraction is refused, not rounded.
      if (typeof wait !== "number" || !Number.isSafeInteger(wait) || wait < 0) {
        throw usage("maxWaitMs must be a whole, non-negative number of milliseconds (a safe integer)");
      }
    }
    refuseConflicts(limit, options.peek === true, options.force === true, wait !== undefined);
    const full = this.fullKey(key);
    checkSignal(options.signal);
    // A request larger than the limit goes to Redis, which answers never (HTTP 413).
    const plain = !options.peek && !options.force && wait === undefined && c >= 1n && c <= limit.capacity;
    const ck = plain && (this.denials || this.batcher) ? `${full}\0${limit.ident()}` : undefined;
    const o = { cost: c, peek: options.peek === true, force: options.force === true, maxWaitMs: wait };
    let batchK = 0n;
    if (ck !== undefined && this.batcher) {
      batchK = this.batcher.size(limit, c);
      if (batchK > 0n) {
        const d = this.fromCredit(ck, full, limit, c);
        if (d !== undefined) return d;
      }
    }
    if (ck !== undefined && this.denials) {
      const local = this.denials.lookup(ck, c);
      if (local !== undefined) {
        this.counter.add("deniedLocally");
        this.counter.countDecision(local);
        return local;
      }
    }
    if (batchK > 0n) return this.checkBatched(ck!, full, limit, o, batchK, options.signal);
    if (this.health.skip()) return this.degradedCheck(limit, full, undefined, o);
    const args = limit.args();
    if (c !== 1n) args.push("QUANTITY", c.toString());
    if (options.peek) args.push("PEEK");
    if (wait !== undefined) args.push("MAXWAIT", String(Math.floor(wait)));
    if (options.force) args.push("FORCE");
    const op: Op = limit instanceof GCRA ? "gcra" : "window";
    let v: unknown;
    let mode: "module" | "fallback";
    const sent = DenyCache.now();
    try {
      [v, mode] = await this.guarded(op, [full], args, options.signal);
    } catch (e) {
      if (e instanceof Down) return this.degradedCheck(limit, full, e.cause, o);
      throw e;
    }
    const d = fromReply(ints(v, 5), limit, full, mode, wait !== undefined);
    if (ck !== undefined) this.denials!.store(ck, [full], c, d, sent);
    return this.decided(d);
  }

  /**
   * Decides one request against several limits atomically (RL.ALL): every limit admits it and
   * all are charged, or none is. The combined decision has each key's in `perKey`, in entry
   * order. On a Cluster, give the keys one hash tag ({user42}:rpm, {user42}:tpm) to get one
   * atomic RL.ALL; keys in several slots are the server's CROSSSLOT error unless
   * `acrossSlots: true` (see it).
   */
  async checkAll(entries: Entries, options: CheckAllOptions = {}): Promise<Decision> {
    refuseUnknown(options, ["cost", "peek", "force", "acrossSlots", "signal"], "checkAll");
    const list = this.entries(entries);
    const c = options.cost === undefined ? 1n : cost(options.cost, "cost");
    checkSignal(options.signal);
    if (options.force === true)
      for (const e of list) refuseConflicts(e.limit, options.peek === true, true, false);
    const o = { cost: c, peek: options.peek === true, force: options.force === true, signal: options.signal };
    if (options.acrossSlots === true && this.transport.cluster) {
      const groups = slotGroups(list.map((e) => e.full));
      if (groups.length > 1) return this.acrossSlots(list, groups, o);
    }
    const d = await this.all(list, o);
    this.counter.countDecision(d);
    return d;
  }

  /**
   * Gives back up to n units to key (RL.REFUND): work admitted but not done. Redis down: the
   * failure policy (open and closed give back nothing, degraded; raise rejects; local gives
   * back in memory).
   *
   * Under "local" a refund goes back where the charge was taken: the units the in-memory
   * limiter charged key while Redis was down and has not given back yet are given back there
   * first, even once Redis answers again (Redis never had them: refunding them there would
   * give back other requests' units), and only the rest of n goes to Redis. Memory remembers
   * those units as long as it holds the key (until the key is idle). A key charged both
   * during an outage and after it is refunded in memory first; a refund misplaced that way
   * only under-admits. refundDecision gives back one decision's charge exactly where it was
   * taken.
   */
  async refund(key: string, n: number | bigint, options: { signal?: AbortSignal } = {}): Promise<Refunded> {
    refuseUnknown(options, ["signal"], "refund");
    const q = toCount(n);
    if (q === undefined || q === 0n) throw invalid("quantity must be a positive integer");
    const full = this.fullKey(key);
    checkSignal(options.signal);
    this.denials?.forget(full);
    let left = q;
    let local: Refunded | undefined;
    if (this.local) {
      const [taken, m] = this.local.memory.refundOwed(full, left, true);
      if (taken > 0n) {
        local = localRefunded(m);
        this.counter.add("refunded", local.refunded);
        left -= taken;
        if (left === 0n) return local;
      }
    }
    const r = await this.report("refund", full, left.toString(), options.signal, true);
    this.counter.add("refunded", r.refunded);
    if (local === undefined) return r;
    return Object.freeze({ ...r, refunded: r.refunded + local.refunded });
  }

  /**
   * Gives back up to n units of the charge `decision` took, where it took it: to the "local"
   * policy's in-memory limiter when it is that limiter's decision (degraded, not blind: taken
   * in memory while Redis was down), even once Redis answers again; nothing when it is blind
   * (the open or closed policy charged nothing); else to Redis (RL.REFUND), and when Redis
   * does not answer that refund is lost (it only under-admits), never taken from memory. It
   * forgets the local denials of the decision's key. `decision` is one key's decision this
   * limiter returned (check, or one of a checkAll's perKey); a combined decision, a lease's
   * and a decision without a key are refused (RateLimitConfigError, ERR_RL_USAGE).
   */
  async refundDecision(
    decision: Decision,
    n: number | bigint,
    options: { signal?: AbortSignal } = {},
  ): Promise<Refunded> {
    refuseUnknown(options, ["signal"], "refundDecision");
    const q = toCount(n);
    if (q === undefined || q === 0n) throw invalid("quantity must be a positive integer");
    if (!decision || typeof decision !== "object" || decision.perKey !== undefined || !decision.key) {
      throw usage("refundDecision needs one key's decision (of a checkAll, each of its perKey)");
    }
    if (decision.spec instanceof Lease) throw usage("a lease is given back with release, not refundDecision");
    checkSignal(options.signal);
    this.denials?.forget(decision.key);
    const r = await this.refundTo(decision, decision.key, q, options.signal);
    this.counter.add("refunded", r.refunded);
    return r;
  }

  /**
   * Frees the lease token holds on key (RL.RELEASE); harmless twice. Under "local" a lease
   * the in-memory limiter granted while Redis was down is freed there too, also once Redis
   * answers again (`refunded` counts the slots freed in both).
   */
  async release(key: string, token: string, options: { signal?: AbortSignal } = {}): Promise<Refunded> {
    refuseUnknown(options, ["signal"], "release");
    const full = this.fullKey(key);
    checkToken(token);
    checkSignal(options.signal);
    const r = await this.report("release", full, token, options.signal, true);
    if (r.degraded || !this.local) return r;
    // Redis answered: a lease memory granted meanwhile is held there, not in Redis.
    const m = this.local.memory.release(full, token);
    return m[0] > 0n ? Object.freeze({ ...r, refunded: r.refunded + Number(m[0]) }) : r;
  }

  /**
   * Gives back (RL.REFUND) every batch unit this limiter still holds, where that is still
   * exact (a window's unit only inside its window, a GCRA unit only while the bucket cannot
   * have drained past it), and resolves to how many units Redis took back. Without batching
   * it does nothing. The limiter still works afterwards; the Redis client is not closed. A
   * refund Redis does not answer is dropped (it only under-admits); one refused with an
   * error reply that is not an outage rejects, after the others were sent.
   */
  async close(): Promise<number> {
    return this.refundLeftovers(true);
  }

  /**
   * Takes a slot of `lease` on key (RL.LEASE) and returns a handle that renews it in the
   * background every third of the lease time (RL.LEASE ... RENEW) until release() or
   * `await using`. No free slot: rejects with RateLimitedError. Redis down: the failure
   * policy (open: a degraded handle that holds nothing; closed: RateLimitedError; raise:
   * RedisUnavailableError; local: a lease taken, renewed and released in memory).
   */
  async acquire(key: string, lease: Lease, options: AcquireOptions = {}): Promise<LeaseHandle> {
    refuseUnknown(options, ["token", "slots", "signal"], "acquire");
    if (!(lease instanceof Lease)) throw usage("acquire needs a Lease");
    const generated = options.token === undefined;
    const token = generated ? newToken() : checkToken(options.token);
    const slots = options.slots === undefined ? 1n : toCount(options.slots);
    if (slots === undefined || slots === 0n) throw invalid("quantity must be a positive integer");
    const full = this.fullKey(key);
    checkSignal(options.signal);
    const args = [...lease.args(), token];
    if (slots !== 1n) args.push("QUANTITY", slots.toString());
    let d: Decision;
    if (this.health.skip()) d = this.degradedLease(lease, full, undefined, token, slots);
    else {
      try {
        const [v, mode] = await this.leaseCall(full, args, token, generated, options.signal);
        d = this.decided(fromReply(ints(v, 5), lease, full, mode, false));
      } catch (e) {
        if (!(e instanceof Down)) throw e;
        d = this.degradedLease(lease, full, e.cause, token, slots);
      }
    }
    if (!d.allowed) throw new RateLimitedError(d);
    return new LeaseHandle(this, full, lease, token, slots, d);
  }

  // -- batching (batch.ts) -------------------------------------------------------------------

  /**
   * Admits cost units of ck from a live credit, if one holds them. Asked before the deny
   * cache: units paid for in Redis are this process's to hand out even while Redis denies
   * the key (a denial cached by one call must not strand another's batch).
   */
  private fromCredit(ck: string, full: string, limit: Limit, c: bigint): Decision | undefined {
    const cr = this.batcher!.take(ck, c);
    if (cr === undefined) return undefined;
    const d = makeDecision({
      allowed: true,
      limit: Number(limit.capacity),
      remaining: cr.remainingSeen + Number(cr.units),
      source: "local",
      spec: limit,
      key: full,
    });
    this.counter.add("allowedLocally");
    this.counter.countDecision(d);
    return d;
  }

  /**
   * A plain check (no peek, force or maxWaitMs; 1 <= cost < k) under batching that no
   * credit answered: one call takes up to k units, keeps what is beyond cost as a credit, and
   * answers (at most three calls when the key has fewer than asked left).
   */
  private async checkBatched(
    ck: string,
    full: string,
    limit: GCRA | Window,
    o: { cost: bigint; peek: boolean; force: boolean; maxWaitMs: number | undefined },
    k: bigint,
    signal: AbortSignal | undefined,
  ): Promise<Decision> {
    const b = this.batcher!;
    const c = o.cost;
    if (this.health.skip()) return this.degradedCheck(limit, full, undefined, o);
    const op: Op = limit instanceof GCRA ? "gcra" : "window";
    let want = b.firstTake(ck, limit, c, k);
    let last: Decision | undefined;
    for (let attempt = 0; attempt < 3; attempt++) {
      const args = limit.args();
      if (want !== 1n) args.push("QUANTITY", want.toString());
      const sent = batchNow();
      let v: unknown;
      let mode: "module" | "fallback";
      try {
        [v, mode] = await this.guarded(op, [full], args, signal);
      } catch (e) {
        if (e instanceof Down) return this.degradedCheck(limit, full, e.cause, o);
        throw e;
      }
      b.observeRTT(sent);
      let d = fromReply(ints(v, 5), limit, full, mode, false);
      b.noteRemaining(ck, d.remaining);
      if (d.allowed) {
        const units = want - c;
        if (units > 0n) {
          const [use, refund] = b.deadlines(limit, want, sent, d.resetAfterMs);
          const at = batchNow();
          if (use > at) {
            // else too close to a window's end: they lapse with it
            b.put(
              ck,
              { key: full, units, useUntil: use, refundUntil: refund, remainingSeen: d.remaining },
              at,
            );
            d = makeDecision({ ...d, remaining: d.remaining + Number(units) });
            this.ensureSweeper();
          }
        }
        return this.decided(d);
      }
      this.denials?.store(ck, [full], want, d, sent);
      last = d;
      if (d.never || want === c) break;
      const derived = denialForCost(limit, d, want, c);
      if (derived !== undefined) {
        this.denials?.store(ck, [full], c, derived, sent - 1);
        last = derived;
        break;
      }
      const fewer = want - 1n < BigInt(d.remaining) ? want - 1n : BigInt(d.remaining);
      want = fewer > c ? fewer : c;
    }
    return this.decided(last!);
  }

  /** Starts the timer that gives back leftovers every hold/2; it stops once no credit is held. */
  private ensureSweeper(): void {
    const b = this.batcher!;
    if (b.timer !== undefined) return;
    let sweeping = false;
    b.timer = setInterval(
      () => {
        if (sweeping) return;
        sweeping = true;
        this.refundLeftovers(false)
          .catch(() => {})
          .finally(() => {
            sweeping = false;
            if (b.empty() && b.timer !== undefined) {
              clearInterval(b.timer);
              b.timer = undefined;
            }
          });
      },
      Math.max(1, b.holdMs / 2),
    );
    b.timer.unref();
  }

  /**
   * Gives back (RL.REFUND) the held units whose hold has passed (every held unit with
   * everything) where that is still exact; resolves to the units Redis took back. A refund
   * Redis does not answer is dropped: a lost refund only under-admits.
   */
  private async refundLeftovers(everything: boolean): Promise<number> {
    const b = this.batcher;
    if (b === undefined) return 0;
    let total = 0;
    let first: unknown;
    for (const cr of b.expired(batchNow(), everything)) {
      if (batchNow() >= cr.refundUntil) continue; // the window rolled over / the bucket may have drained: let it lapse
      try {
        const [v] = await this.guarded("refund", [cr.key], [cr.units.toString()], undefined);
        this.health.success();
        const r = ints(v, 3);
        if (r[0]! > 0) {
          total += r[0]!;
          this.counter.add("refunded", r[0]!);
        }
      } catch (e) {
        if (!(e instanceof Down) && first === undefined) first = e;
      }
    }
    if (first !== undefined) throw first;
    return total;
  }

  // -- internals ---------------------------------------------------------------------------

  /**
   * Sends acquire's RL.LEASE. The call itself is not cut short by the signal (the limiter's
   * timeout bounds it): when the signal aborts first, acquire rejects with its reason at once
   * and the reply is awaited in the background, where a slot it granted under a token this
   * limiter generated is released (nobody else has that token: the slot would otherwise stay
   * held until the lease ran out). A token the caller chose is the caller's: this call may only
   * have renewed a lease the caller holds, so it is left alone (docs/clients.md: an acquire
   * given up while its RL.LEASE is in flight).
   */
  private leaseCall(
    full: string,
    args: string[],
    token: string,
    generated: boolean,
    signal: AbortSignal | undefined,
  ): Promise<[unknown, "module" | "fallback"]> {
    const call = this.guarded("lease", [full], args, undefined);
    if (signal === undefined) return call;
    return new Promise((resolve, reject) => {
      let settled = false;
      const onAbort = () => {
        if (settled) return;
        settled = true;
        reject(signal.reason);
        call.then(
          ([v]) => {
            if (!generated) return;
            let allowed = false;
            try {
              allowed = ints(v, 5)[0] === 1;
            } catch {
              return;
            }
            // A failed release only under-admits: the slot lapses with its lease.
            if (allowed) this.report("release", full, token, undefined, false).catch(() => {});
          },
          () => {},
        );
      };
      signal.addEventListener("abort", onAbort, { once: true });
      call.then(
        (r) => {
          if (settled) return;
          settled = true;
          signal.removeEventListener("abort", onAbort);
          resolve(r);
        },
        (e) => {
          if (settled) return;
          settled = true;
          signal.removeEventListener("abort", onAbort);
          reject(e);
        },
      );
    });
  }

  /** @internal */
  fullKey(key: unknown): string {
    if (typeof key !== "string" || key === "") throw usage("key must be a non-empty string");
    return this.prefix + key;
  }

  private entries(entries: Entries): Entry[] {
    let pairs: [string, unknown][];
    if (entries instanceof Map) pairs = [...entries.entries()];
    else if (Array.isArray(entries)) pairs = entries.map((p) => [p[0], p[1]]);
    else if (entries && typeof entries === "object") pairs = Object.entries(entries);
    else throw usage("checkAll needs entries: {key: limit, ...}, a Map or [[key, limit], ...]");
    if (pairs.length === 0) throw usage("checkAll needs at least one entry");
    const seen = new Set<string>();
    return pairs.map(([key, v], i) => {
      let limit: unknown = v;
      let c: bigint | undefined;
      let token: string | undefined;
      if (!isLimit(v)) {
        if (!v || typeof v !== "object") throw usage(`entry ${i + 1} ('${key}') has no limit`);
        refuseUnknown(v, ["limit", "cost", "token"], `checkAll's entry '${key}'`);
        const spec = v as EntrySpec;
        limit = spec.limit;
        if (spec.cost !== undefined) c = cost(spec.cost, "cost");
        if (spec.token !== undefined) token = spec.token;
      }
      if (!isLimit(limit)) throw usage(`entry ${i + 1} ('${key}') has no limit`);
      if (limit instanceof Lease && token === undefined)
        throw usage(`the Lease entry for '${key}' needs a token`);
      if (token !== undefined) {
        if (!(limit instanceof Lease)) throw usage(`only a Lease entry takes a token ('${key}')`);
        checkToken(token);
      }
      const full = this.fullKey(key);
      if (seen.has(full)) throw usage(`key '${key}' is given twice`);
      seen.add(full);
      return { key, full, limit, cost: c, token };
    });
  }

  private async all(
    list: Entry[],
    o: { cost: bigint; peek: boolean; force: boolean; signal: AbortSignal | undefined },
  ): Promise<Decision> {
    if (this.health.skip()) return this.degradedAll(list, undefined, o);
    const args: string[] = [];
    for (const e of list) {
      args.push(e.limit.head(), ...e.limit.args());
      if (e.token !== undefined) args.push(e.token);
      if (e.cost !== undefined) args.push("COST", e.cost.toString());
    }
    if (o.cost !== 1n) args.push("QUANTITY", o.cost.toString());
    if (o.peek) args.push("PEEK");
    if (o.force) args.push("FORCE");
    let v: unknown;
    let mode: "module" | "fallback";
    try {
      [v, mode] = await this.guarded(
        "all",
        list.map((e) => e.full),
        args,
        o.signal,
      );
    } catch (e) {
      if (e instanceof Down) return this.degradedAll(list, e.cause, o);
      throw e;
    }
    this.health.success();
    const [combined, each] = allReply(v);
    if (each.length !== list.length) throw new ProtocolError(`${list.length} per-key replies`, v);
    const perKey = each.map((r, i) => fromReply(r, list[i]!.limit, list[i]!.full, mode, false));
    const c = fromReply(combined, undefined, "", mode, false);
    return makeDecision({ ...c, spec: binding(c, perKey), perKey });
  }

  private async acrossSlots(
    list: Entry[],
    groups: number[][],
    o: { cost: bigint; peek: boolean; force: boolean; signal: AbortSignal | undefined },
  ): Promise<Decision> {
    const per: Decision[] = new Array(list.length);
    const charge = (i: number) => list[i]!.cost ?? o.cost;
    let deniedAt = -1;
    for (let gi = 0; gi < groups.length; gi++) {
      const g = groups[gi]!;
      let d: Decision;
      try {
        d = await this.all(
          g.map((i) => list[i]!),
          o,
        );
      } catch (e) {
        if (gi > 0 && !o.peek) await this.giveBack(list, per, groups.slice(0, gi), charge);
        throw e;
      }
      g.forEach((i, j) => (per[i] = d.perKey![j]!));
      if (!d.allowed) {
        deniedAt = gi;
        break;
      }
    }
    if (deniedAt >= 0) {
      if (deniedAt > 0 && !o.peek) await this.giveBack(list, per, groups.slice(0, deniedAt), charge);
      for (const g of groups.slice(deniedAt + 1)) {
        const d = await this.all(
          g.map((i) => list[i]!),
          { ...o, peek: true },
        );
        g.forEach((i, j) => (per[i] = d.perKey![j]!));
      }
    }
    const d = combine(
      per,
      list.map((_, i) => charge(i)),
    );
    this.counter.countDecision(d);
    return d;
  }

  /** Gives back (refunds, or releases for a lease) what the earlier slot groups took. */
  private async giveBack(list: Entry[], per: Decision[], groups: number[][], charge: (i: number) => bigint) {
    for (const g of groups) {
      for (const i of g) {
        const e = list[i]!;
        const n = charge(i);
        const d = per[i];
        if (n === 0n || d === undefined || d.blind) continue;
        try {
          if (e.limit instanceof Lease) {
            if (this.takenLocally(d)) this.local!.memory.release(e.full, e.token!);
            else await this.report("release", e.full, e.token!, undefined, false);
          } else {
            const r = await this.refundTo(d, e.full, n, undefined);
            this.counter.add("refunded", r.refunded);
          }
        } catch {
          // Lost (Redis down, or an error reply): it only under-admits.
        }
      }
    }
  }

  /**
   * A one-key call that reports without deciding (refund, release). When Redis does not
   * answer, the "local" policy's memory answers if inMemory, else the policy (a refund or
   * release of what Redis took is then lost: it only under-admits).
   */
  private async report(
    op: "refund" | "release",
    full: string,
    arg: string,
    signal: AbortSignal | undefined,
    inMemory: boolean,
  ): Promise<Refunded> {
    let cause: unknown;
    if (!this.health.skip()) {
      try {
        const [v] = await this.guarded(op, [full], [arg], signal);
        this.health.success();
        const r = ints(v, 3);
        return Object.freeze({
          refunded: Math.max(0, r[0]!),
          remaining: Math.max(0, r[1]!),
          resetAfterMs: Math.max(0, r[2]!),
          degraded: false,
        });
      } catch (e) {
        if (!(e instanceof Down)) throw e;
        cause = e.cause;
      }
    }
    if (this.local && inMemory) {
      // "local": given back in memory (to what the local policy charged).
      const m = this.local.memory;
      return localRefunded(op === "refund" ? m.refund(full, BigInt(arg)) : m.release(full, arg));
    }
    this.health.answer(undefined, full, cause); // rejects under "raise"
    return Object.freeze({ refunded: 0, remaining: 0, resetAfterMs: 0, degraded: true });
  }

  /** Whether d's charge was taken by the "local" policy's in-memory limiter. @internal */
  takenLocally(d: Decision): boolean {
    return this.local !== undefined && d.degraded && !d.blind;
  }

  /** Gives back n units of full's charge where decision d took it (the counters are the caller's). */
  private async refundTo(
    d: Decision,
    full: string,
    n: bigint,
    signal: AbortSignal | undefined,
  ): Promise<Refunded> {
    if (d.blind) return Object.freeze({ refunded: 0, remaining: 0, resetAfterMs: 0, degraded: true });
    if (this.takenLocally(d)) return localRefunded(this.local!.memory.refundOwed(full, n, false)[1]);
    return this.report("refund", full, n.toString(), signal, false);
  }

  private degraded(limit: Limit, full: string, cause: unknown): Decision {
    const d = this.health.answer(limit, full, cause);
    this.counter.countDecision(d);
    return d;
  }

  private decidedLocally(d: Decision): Decision {
    this.counter.add("local");
    this.counter.countDecision(d);
    return d;
  }

  /** The failure policy's answer to a check Redis did not answer: the in-memory limits under "local", else open / closed / raise. */
  private degradedCheck(
    limit: GCRA | Window,
    full: string,
    cause: unknown,
    o: { cost: bigint; peek: boolean; force: boolean; maxWaitMs: number | undefined },
  ): Decision {
    if (!this.local) return this.degraded(limit, full, cause);
    const [shown, spec] = this.local.share(limit);
    const r = this.local.memory.check(full, spec, o.cost, o.peek, o.force, o.maxWaitMs);
    return this.decidedLocally(localDecision(r, shown, full, o.maxWaitMs !== undefined));
  }

  /** The failure policy's answer to an acquire Redis did not answer. */
  private degradedLease(lease: Lease, full: string, cause: unknown, token: string, slots: bigint): Decision {
    if (!this.local) return this.degraded(lease, full, cause);
    const [shown, spec] = this.local.share(lease);
    const r = this.local.memory.lease(full, spec, token, slots, false, false);
    return this.decidedLocally(localDecision(r, shown, full, false));
  }

  /**
   * Renews (renew) or frees a lease the "local" policy granted, in memory: the decision, or
   * the LEASELOST RedisReplyError when the token no longer holds it. @internal
   */
  renewLocally(full: string, lease: Lease, token: string, slots: bigint): Decision {
    const [shown, spec] = this.local!.share(lease);
    const r = this.local!.memory.lease(full, spec, token, slots, false, true);
    return localDecision(r, shown, full, false);
  }

  /** Frees a lease the "local" policy granted, in memory. @internal */
  releaseLocally(full: string, token: string): Refunded {
    return localRefunded(this.local!.memory.release(full, token));
  }

  /** RL.ALL in memory ("local"); the caller counts the decision. */
  private localAll(list: Entry[], o: { cost: bigint; peek: boolean; force: boolean }): Decision {
    const local = this.local!;
    const shares = list.map((e) => local.share(e.limit));
    const [combined, each] = local.memory.checkAll(
      list.map((e, i) => ({ key: e.full, spec: shares[i]![1], cost: e.cost, token: e.token })),
      o.cost,
      o.peek,
      o.force,
    );
    const perKey = each.map((r, i) => localDecision(r, shares[i]![0], list[i]!.full, false));
    const c = localDecision(combined, undefined, "", false);
    this.counter.add("local");
    return makeDecision({ ...c, spec: binding(c, perKey), perKey });
  }

  private degradedAll(
    list: Entry[],
    cause: unknown,
    o: { cost: bigint; peek: boolean; force: boolean },
  ): Decision {
    if (this.local) return this.localAll(list, o);
    const d = this.health.answer(undefined, "", cause);
    const perKey = list.map((e) => this.health.answer(e.limit, e.full, cause));
    let bind: Decision | undefined;
    for (const p of perKey) if (p.limit > 0 && (bind === undefined || p.limit < bind.limit)) bind = p;
    return makeDecision({ ...d, limit: bind?.limit ?? 0, spec: bind?.spec, perKey });
  }

  private decided(d: Decision): Decision {
    this.health.success();
    this.counter.countDecision(d);
    return d;
  }

  /** call with outages counted and thrown as Down (its cause the outage). @internal */
  async guarded(
    op: Op,
    keys: string[],
    args: string[],
    signal: AbortSignal | undefined,
  ): Promise<[unknown, "module" | "fallback"]> {
    try {
      return await this.call(op, keys, args, signal);
    } catch (e) {
      if (!signal?.aborted && isUnavailable(e)) {
        this.health.failure(this.counter, e);
        throw new Down(e);
      }
      throw e;
    }
  }

  /**
   * One command through `send` within the limiter's timeout, honouring signal: rejects with
   * the signal's reason when it aborts first, RedisTimeoutError (an outage) when the timeout
   * runs out first.
   */
  private raw(send: () => Promise<unknown>, signal: AbortSignal | undefined): Promise<unknown> {
    signal?.throwIfAborted();
    return new Promise((resolve, reject) => {
      let done = false;
      const finish = (f: () => void) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        f();
      };
      const onAbort = () => finish(() => reject(signal!.reason));
      const timer = setTimeout(
        () => finish(() => reject(new RedisTimeoutError(this.timeoutMs))),
        this.timeoutMs,
      );
      signal?.addEventListener("abort", onAbort, { once: true });
      let p: Promise<unknown>;
      try {
        p = send();
      } catch (e) {
        p = Promise.reject(e);
      }
      p.then(
        (v) => finish(() => resolve(v)),
        (e) => finish(() => reject(e)),
      );
    });
  }

  private send(args: readonly string[], key: string | undefined, signal: AbortSignal | undefined) {
    return this.raw(() => this.transport.send(args, key), signal);
  }

  private onNode(node: NodeHandle, args: readonly string[], signal: AbortSignal | undefined) {
    return this.raw(() => node.send(args), signal);
  }

  private async modeNow(signal: AbortSignal | undefined): Promise<"module" | "fallback"> {
    let m: "module" | "fallback";
    if (this.mode === "auto") m = this.resolved ?? (await this.detect(signal));
    else m = this.mode;
    if (m === "fallback" && !this.libraryReady) {
      this.preparing ??= this.ensureLibrary(signal).finally(() => (this.preparing = undefined));
      await this.preparing;
      this.libraryReady = true;
    }
    return m;
  }

  /** Asks the server whether the module is loaded (COMMAND INFO RL.GCRA), once at a time. */
  private detect(signal: AbortSignal | undefined): Promise<"module" | "fallback"> {
    this.detecting ??= (async () => {
      let m: "module" | "fallback" = "module";
      try {
        const reply = await this.send(["COMMAND", "INFO", "RL.GCRA"], undefined, signal);
        if (!commandExists(reply)) m = "fallback";
      } catch (e) {
        // An ACL that admits the limiter's commands but not COMMAND: try the module; an
        // unknown command moves to the fallback.
        if (errorCode(e) !== "NOPERM") throw e;
      }
      this.resolved = m;
      return m;
    })().finally(() => (this.detecting = undefined));
    return this.detecting;
  }

  /**
   * Makes every master run our library version or a newer one, each by its own plan
   * (docs/clients.md#the-fallback-where-users-are). Where FCALL is refused, or the library is
   * missing and FUNCTION is refused, the fallback runs as a script.
   */
  private async ensureLibrary(signal: AbortSignal | undefined): Promise<void> {
    const nodes = await this.raw(() => this.transport.masters(), signal);
    for (const node of nodes as NodeHandle[]) {
      let theirs = "";
      let loaded = true;
      try {
        const v = await this.onNode(node, ["FCALL_RO", "rl_version", "0"], signal);
        theirs = typeof v === "string" ? v : String(v);
      } catch (e) {
        if (isMissingFunction(e)) loaded = false;
        else if (isRefused(e)) {
          this.useScripts(e);
          return;
        } else throw e;
      }
      if (await this.loadOn(node, theirs, loaded, signal)) return;
    }
  }

  /** Loads our library on node as planFor says; true when the fallback moved to scripts. */
  private async loadOn(
    node: NodeHandle,
    theirs: string,
    loaded: boolean,
    signal: AbortSignal | undefined,
  ): Promise<boolean> {
    const ours = LIBRARY_VERSION;
    const at = node.id;
    for (let attempt = 0; attempt < 2; attempt++) {
      const plan = planFor(theirs, loaded, ours);
      if (plan === "keep") return false;
      if (plan === "newer") {
        this.emit({ type: "library-newer", node: at, ours, theirs });
        return false;
      }
      if (!this.loadLibrary) {
        if (plan === "load") {
          throw new LibraryError(
            `the redis_rl Functions library is not loaded${at ? " on " + at : ""} and loading it is not allowed (loadLibrary: false)`,
          );
        }
        this.emit({
          type: "library-kept",
          node: at,
          ours,
          theirs,
          reason: "older, and loadLibrary is false",
        });
        return false;
      }
      const load =
        plan === "replace"
          ? ["FUNCTION", "LOAD", "REPLACE", await this.configuredFor(node, signal)]
          : ["FUNCTION", "LOAD", LUA_LIBRARY_TEXT];
      try {
        await this.onNode(node, load, signal);
        this.emit({ type: "library-loaded", node: at, ours, had: loaded ? theirs : "none" });
        return false;
      } catch (e) {
        if (plan === "load" && serverError(e).toLowerCase().includes("already exists")) {
          // Another client loaded it since we looked: "" (no rl_version) is older.
          try {
            const v = await this.onNode(node, ["FCALL_RO", "rl_version", "0"], signal);
            theirs = String(v);
          } catch (e2) {
            if (!isMissingFunction(e2)) throw e2;
            theirs = "";
          }
          loaded = true;
          continue;
        }
        if (isRefused(e)) {
          if (loaded) {
            this.emit({
              type: "library-kept",
              node: at,
              ours,
              theirs,
              reason: `cannot load: ${describe(e)}`,
            });
            return false;
          }
          this.useScripts(e);
          return true;
        }
        throw e;
      }
    }
    return false;
  }

  private async configuredFor(node: NodeHandle, signal: AbortSignal | undefined): Promise<string> {
    try {
      const v = await this.onNode(
        node,
        ["FUNCTION", "LIST", "LIBRARYNAME", LIBRARY_NAME, "WITHCODE"],
        signal,
      );
      const lib = listedLibrary(v);
      return lib ? configuredCode(LUA_LIBRARY_TEXT, lib.code) : LUA_LIBRARY_TEXT;
    } catch {
      return LUA_LIBRARY_TEXT;
    }
  }

  private useScripts(why: unknown): void {
    if (!this.scripts) {
      this.scripts = true;
      this.emit({ type: "scripts", reason: describe(why) });
    }
  }

  private scriptForm(): ScriptCall {
    if (!this.scripts) return "functions";
    if (this.evalRefused) return "sha";
    if (this.evalshaRefused || !this.scriptCached) return "text";
    return "sha";
  }

  /** How a call sent as a script goes on after err ("none", "retry", "load"). */
  private scriptRecovery(sent: ScriptCall, err: unknown): "none" | "retry" | "load" {
    if (sent === "sha" && isNoScript(err)) {
      if (this.evalRefused) return "load";
      this.scriptCached = false;
      return "retry";
    }
    if (!isRefused(err)) return "none";
    if (sent === "text") {
      const first = !this.evalRefused;
      this.evalRefused = true;
      if (this.evalshaRefused) return "none";
      return first ? "load" : "retry";
    }
    if (sent === "sha") {
      this.evalshaRefused = true;
      return this.evalRefused ? "none" : "retry";
    }
    return "none";
  }

  private async scriptLoad(keys: string[], signal: AbortSignal | undefined): Promise<void> {
    const node = await this.raw(() => this.transport.masterFor(keys[0]!), signal);
    try {
      await this.onNode(node as NodeHandle, ["SCRIPT", "LOAD", SCRIPT_TEXT], signal);
    } catch (e) {
      if (isRefused(e)) throw noScripting(e);
      throw e;
    }
  }

  /**
   * Asks the library's no-writes twin of op (FCALL_RO rl_<op>_ro, the same keys and
   * arguments, the master of the first key's slot) once, after the server refused FCALL
   * rl_<op> out of memory (docs/clients.md#out-of-memory). Without a twin the first OOM
   * error stands.
   */
  private async twin(op: Op, keys: string[], args: string[], oom: unknown, signal: AbortSignal | undefined) {
    const name = twinName(op);
    if (name === undefined) throw oom;
    let node: NodeHandle;
    try {
      node = (await this.raw(() => this.transport.masterFor(keys[0]!), signal)) as NodeHandle;
    } catch (e) {
      if (signal?.aborted) throw e;
      throw oom;
    }
    this.counter.add("redisCalls");
    try {
      return await this.onNode(node, ["FCALL_RO", name, String(keys.length), ...keys, ...args], signal);
    } catch (e) {
      if (!signal?.aborted && (isMissingFunction(e) || isRefused(e) || isRedirect(e))) throw oom;
      throw e;
    }
  }

  /**
   * Runs one command in the resolved mode, detecting again once when the module disappeared
   * or the library was flushed, retrying once a connection-level failure, asking the OOM twin
   * once, and, as a script, going on as scriptRecovery says. @internal
   */
  async call(
    op: Op,
    keys: string[],
    args: string[],
    signal: AbortSignal | undefined,
  ): Promise<[unknown, "module" | "fallback"]> {
    let reconnected = false;
    let redetected = false;
    for (let i = 0; i < 5; i++) {
      let mode: "module" | "fallback" = this.resolved ?? (this.mode === "auto" ? "module" : this.mode);
      let form: ScriptCall = "functions";
      let err: unknown;
      try {
        mode = await this.modeNow(signal);
        this.counter.add("redisCalls");
        if (mode === "fallback") form = this.scriptForm();
        const wire = frame(mode, form, SCRIPT_SHA, op, keys, args);
        const v = await this.send(wire, keys[0], signal);
        if (form === "text") this.scriptCached = true;
        return [v, mode];
      } catch (e) {
        err = e;
      }
      if (err instanceof LibraryError || err instanceof RateLimitConfigError) throw err;
      if (signal?.aborted) throw signal.reason;
      if (mode === "fallback" && form === "functions" && isOOM(err)) {
        return [await this.twin(op, keys, args, err, signal), mode];
      }
      if (!reconnected && isConnectionLevel(err)) {
        reconnected = true;
        continue;
      }
      if (!redetected && mode === "module" && this.mode === "auto" && isUnknownCommand(err)) {
        redetected = true;
        this.resolved = "fallback";
        continue;
      }
      if (mode === "fallback" && form !== "functions") {
        const step = this.scriptRecovery(form, err);
        if (step === "retry") continue;
        if (step === "load") {
          await this.scriptLoad(keys, signal);
          continue;
        }
        if (isRefused(err)) throw noScripting(err);
      }
      if (!redetected && mode === "fallback" && form === "functions" && isMissingFunction(err)) {
        redetected = true;
        this.libraryReady = false;
        continue;
      }
      throw err;
    }
    throw new LibraryError(`the fallback kept failing on this server (rl_${op})`);
  }
}

function noScripting(err: unknown): LibraryError {
  return new LibraryError(
    "cannot decide on this server: it has no redis-rl module (RL.GCRA is not there) and refuses the Lua fallback " +
      `both as a Functions library (FUNCTION/FCALL) and as scripts (EVAL/EVALSHA): ${describe(err)}. ` +
      "Load the module, or allow FCALL and FUNCTION, or EVAL and EVALSHA, for this client",
    err,
  );
}

/** A denial returned as an error (acquire): `decision` says when it may pass, or that it never can. */
export class RateLimitedError extends Error {
  readonly code = "ERR_RL_RATE_LIMITED";
  constructor(readonly decision: Decision) {
    super(
      decision.never
        ? `redis-rl: rate limited: never allowed (limit ${decision.limit})`
        : `redis-rl: rate limited: retry after ${decision.retryAfterMs} ms (limit ${decision.limit})`,
    );
    this.name = "RateLimitedError";
  }
}

export { RedisReplyError, Window };
