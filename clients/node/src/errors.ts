// The package's errors. Configuration errors carry a `code` (express-rate-limit's coded
// configuration errors); outages, denials returned as errors and lost leases have their own
// classes, so callers branch with `instanceof` or on `code`.

/** The codes of RateLimitConfigError. */
export type ConfigErrorCode =
  /** A limit or a request argument that breaks the module's rules (the module's message). */
  | "ERR_RL_INVALID_LIMIT"
  /** An option the limiter, a limit or a call does not know. */
  | "ERR_RL_UNKNOWN_OPTION"
  /** An option of the wrong type or out of range. */
  | "ERR_RL_INVALID_OPTION"
  /** A call the API does not allow (a Lease passed to check, an empty key, ...). */
  | "ERR_RL_USAGE";

/**
 * A configuration error: thrown when a limit or a limiter is built (never logged and carried
 * on), and by a call whose arguments the API does not allow. Its message is the module's
 * error text (without "ERR ") when `code` is "ERR_RL_INVALID_LIMIT", so
 * `new GCRA({burst: 0, rate: 1, periodMs: 1000})` fails with "burst must be a positive
 * integer", exactly as `RL.GCRA key 0 1 1` would (docs/clients.md#limits-are-values).
 */
export class RateLimitConfigError extends Error {
  readonly code: ConfigErrorCode;
  constructor(code: ConfigErrorCode, message: string) {
    super(message);
    this.name = "RateLimitConfigError";
    this.code = code;
  }
}

export function invalid(message: string): RateLimitConfigError {
  return new RateLimitConfigError("ERR_RL_INVALID_LIMIT", message);
}

export function usage(message: string): RateLimitConfigError {
  return new RateLimitConfigError("ERR_RL_USAGE", message);
}

export function badOption(message: string): RateLimitConfigError {
  return new RateLimitConfigError("ERR_RL_INVALID_OPTION", message);
}

/** Refuses every key of `given` that is not in `known` (options are validated when built). */
export function refuseUnknown(given: object | undefined, known: readonly string[], what: string): void {
  if (given === undefined || given === null) return;
  if (typeof given !== "object") {
    throw badOption(`${what} takes an options object, not ${typeof given}`);
  }
  for (const k of Object.keys(given)) {
    if (!known.includes(k)) {
      throw new RateLimitConfigError(
        "ERR_RL_UNKNOWN_OPTION",
        `unknown option '${k}' for ${what} (known: ${known.join(", ")})`,
      );
    }
  }
}

/**
 * Redis did not answer (refused or lost connection, the limiter's timeout, OOM, LOADING,
 * CLUSTERDOWN, TRYAGAIN, READONLY, MASTERDOWN) and the failure policy is "raise". `cause` is
 * what the call met.
 */
export class RedisUnavailableError extends Error {
  readonly code = "ERR_RL_UNAVAILABLE";
  constructor(cause: unknown) {
    super(`redis-rl: Redis unavailable: ${describe(cause)}`, { cause });
    this.name = "RedisUnavailableError";
  }
}

/** A server with no module where the Lua fallback cannot run, or may not be loaded. */
export class LibraryError extends Error {
  readonly code = "ERR_RL_LIBRARY";
  constructor(message: string, cause?: unknown) {
    super(`redis-rl: ${message}`, cause === undefined ? undefined : { cause });
    this.name = "LibraryError";
  }
}

/**
 * An error reply of the server that is not an outage (WRONGTYPE, a wrong argument, a
 * server-side cap, NOPERM, CROSSSLOT, LEASELOST): `reply` is the server's text, `cause` the
 * client library's error.
 */
export class RedisReplyError extends Error {
  readonly code = "ERR_RL_REPLY";
  /** The server's error text ("WRONGTYPE Operation against a key ..."). */
  readonly reply: string;
  constructor(reply: string, cause?: unknown) {
    super(reply, cause === undefined ? undefined : { cause });
    this.name = "RedisReplyError";
    this.reply = reply;
  }
  /** The first word of the reply ("WRONGTYPE", "ERR", "NOSCRIPT", ...). */
  get replyCode(): string {
    const i = this.reply.indexOf(" ");
    return i < 0 ? this.reply : this.reply.slice(0, i);
  }
}

/** The limiter's own command timeout ran out: an outage. */
export class RedisTimeoutError extends Error {
  readonly code = "ERR_RL_TIMEOUT";
  constructor(ms: number) {
    super(`redis-rl: no reply within the command timeout (${ms} ms)`);
    this.name = "RedisTimeoutError";
  }
}

export function describe(e: unknown): string {
  if (e instanceof Error) return e.message;
  return String(e);
}
