// An express-rate-limit Store on redis-rl (RL.WINDOW, with the module or its Lua fallback):
// `rateLimit({windowMs, limit, store: new RedisRlStore({sendCommand})})` in place of
// rate-limit-redis's RedisStore, with the same constructor options.
//
// express-rate-limit calls increment(key) and decides itself (totalHits > limit), so the store
// counts: every hit, in an epoch-aligned FIXED window of windowMs (docs/reference.md#r-window-2)
// whose limit no count reaches (10^15), so totalHits is the exact count and resetTime
// the window's end, as rate-limit-redis counts them (every hit, denied ones too).

import {
  RateLimitConfigError,
  RedisUnavailableError,
  badOption,
  describe,
  refuseUnknown,
  usage,
} from "../errors.js";
import { Window } from "../limits.js";
import { RateLimiter, type RateLimiterOptions } from "../limiter.js";
import type { FailurePolicy } from "../policy.js";
import type { Mode } from "../protocol.js";
import { safeKeyPart } from "./keys.js";

/** express-rate-limit's ClientRateLimitInfo. */
export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

/** Options of RedisRlStore: how to reach Redis (one of sendCommand, client, limiter) and the key prefix. */
export interface RedisRlStoreOptions {
  /** As rate-limit-redis takes it: `(...args) => client.sendCommand(args)` (node-redis) or `(command, ...args) => client.call(command, ...args)` (ioredis). */
  sendCommand?: (...args: string[]) => Promise<unknown>;
  /** An ioredis Redis or Cluster, or a connected node-redis client or cluster. */
  client?: unknown;
  /** A RateLimiter to share (its prefix, mode and failure policy). */
  limiter?: RateLimiter;
  /** Put before every key (default "rl:", as rate-limit-redis). */
  prefix?: string;
  /** Without limiter: "auto" (default), "module" or "fallback". */
  mode?: Mode;
  /**
   * Without limiter: what an outage does (default "raise": increment rejects, and
   * express-rate-limit's passOnStoreError decides; "open" admits; "closed" rejects with a 503
   * error).
   */
  onError?: FailurePolicy;
  /** Without limiter: the bound of each Redis call (500 ms). */
  timeoutMs?: number;
}

const STORE_OPTIONS = ["sendCommand", "client", "limiter", "prefix", "mode", "onError", "timeoutMs"];

/**
 * A limit no count reaches (10^15: every client library reads it, and the remaining below it,
 * exactly; node-redis reads integers near 2^53 inexactly), so every hit is admitted and counted.
 */
const COUNT_LIMIT = 1_000_000_000_000_000;

/** The limiter could not decide: express answers it 503 (or express-rate-limit's passOnStoreError admits). */
export class StoreUnavailableError extends Error {
  readonly code = "ERR_RL_UNAVAILABLE";
  readonly status = 503;
  readonly statusCode = 503;
  constructor(cause: unknown) {
    super(`redis-rl store: the rate limiter is unavailable: ${describe(cause)}`, { cause });
    this.name = "StoreUnavailableError";
  }
}

/**
 * An express-rate-limit Store backed by redis-rl: increment counts a hit in an epoch-aligned
 * FIXED window of the middleware's windowMs (RL.WINDOW), decrement gives one back
 * (RL.REFUND), resetKey deletes the key, get reads the count without a hit. Keys are
 * `<prefix><escaped key>` (braces and other bytes escaped as docs/clients.md#escaped-values
 * says, so a key never picks a Cluster hash tag). localKeys is false: every process shares the
 * counts.
 */
export class RedisRlStore {
  readonly prefix: string;
  readonly localKeys = false;
  readonly limiter: RateLimiter;
  private window: Window | undefined;
  private initError: Error | undefined;

  constructor(options: RedisRlStoreOptions) {
    refuseUnknown(options, STORE_OPTIONS, "RedisRlStore");
    if (!options || typeof options !== "object")
      throw usage("RedisRlStore needs options: {sendCommand}, {client} or {limiter}");
    const ways = [options.sendCommand, options.client, options.limiter].filter((x) => x !== undefined).length;
    if (ways !== 1) throw usage("RedisRlStore needs exactly one of sendCommand, client and limiter");
    const prefix = options.prefix ?? "rl:";
    if (typeof prefix !== "string" || /[{}]/.test(prefix)) {
      throw badOption("RedisRlStore: prefix must be a string without '{' or '}'");
    }
    this.prefix = prefix;
    if (options.limiter !== undefined) {
      if (!(options.limiter instanceof RateLimiter))
        throw badOption("RedisRlStore: limiter must be a RateLimiter");
      for (const k of ["mode", "onError", "timeoutMs"] as const) {
        if (options[k] !== undefined)
          throw badOption(`RedisRlStore: ${k} is the limiter's own; give it to the RateLimiter`);
      }
      this.limiter = options.limiter;
    } else {
      const lo: RateLimiterOptions = { onError: options.onError ?? "raise" };
      if (options.mode !== undefined) lo.mode = options.mode;
      if (options.timeoutMs !== undefined) lo.timeoutMs = options.timeoutMs;
      if (options.sendCommand !== undefined) {
        const send = options.sendCommand;
        if (typeof send !== "function") throw badOption("RedisRlStore: sendCommand must be a function");
        lo.sendCommand = (args) => send(...args);
      } else lo.client = options.client;
      this.limiter = new RateLimiter(lo);
    }
  }

  /** Called by express-rate-limit with its options: reads windowMs. */
  init(options: { windowMs?: number }): void {
    try {
      this.window = new Window({
        limit: COUNT_LIMIT,
        windowMs: options?.windowMs ?? 60_000,
        algorithm: "FIXED",
      });
      this.initError = undefined;
    } catch (e) {
      this.initError = e as Error;
      throw e;
    }
  }

  private spec(): Window {
    if (this.window) return this.window;
    throw (
      this.initError ??
      new RateLimitConfigError(
        "ERR_RL_USAGE",
        "RedisRlStore: init(options) was not called (give the store to express-rate-limit)",
      )
    );
  }

  private key(key: string): string {
    return this.prefix + safeKeyPart(String(key));
  }

  private async count(key: string, cost: 0 | 1): Promise<ClientRateLimitInfo> {
    const w = this.spec();
    let d;
    try {
      d = await this.limiter.check(this.key(key), w, { cost });
    } catch (e) {
      if (e instanceof RedisUnavailableError) throw new StoreUnavailableError(e.cause);
      throw e;
    }
    if (d.degraded) {
      // The failure policy answered: open admits (one hit), closed refuses (503).
      if (!d.allowed)
        throw new StoreUnavailableError(new Error("Redis did not answer (closed failure policy)"));
      return { totalHits: cost, resetTime: new Date(Date.now() + w.windowMs) };
    }
    return { totalHits: d.limit - d.remaining, resetTime: new Date(Date.now() + d.resetAfterMs) };
  }

  /** Counts a hit: the key's hits in the current window, and when the window ends. */
  increment(key: string): Promise<ClientRateLimitInfo> {
    return this.count(key, 1);
  }

  /** Gives one hit back (a request express-rate-limit skips after the fact). */
  async decrement(key: string): Promise<void> {
    this.spec();
    await this.limiter.refund(this.key(key), 1);
  }

  /** Forgets the key's hits. */
  async resetKey(key: string): Promise<void> {
    const full = this.limiter.prefix + this.key(key);
    await this.limiter.transport.send(["DEL", full], full);
  }

  /** The key's hits and the window's end, without counting one (undefined: none). */
  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    const info = await this.count(key, 0);
    return info.totalHits > 0 ? info : undefined;
  }
}

export default RedisRlStore;
