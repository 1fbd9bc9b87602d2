// redis-rl: distributed rate limits on Redis, with the redis-rl module or its Lua fallback.
export { GCRA, Window, Lease, parseLimits, parseAlgorithm, formatSeconds, MAX_SECONDS } from "./limits.js";
export type {
  Limit,
  Algorithm,
  StringAlgorithm,
  Count,
  GCRAOptions,
  WindowOptions,
  LeaseOptions,
} from "./limits.js";
export type { Decision, Refunded, Source } from "./decision.js";
export { ProtocolError } from "./decision.js";
export {
  RateLimitConfigError,
  RedisUnavailableError,
  RedisReplyError,
  RedisTimeoutError,
  LibraryError,
} from "./errors.js";
export type { ConfigErrorCode } from "./errors.js";
export { RateLimiter, RateLimitedError } from "./limiter.js";
export type {
  RateLimiterOptions,
  CheckOptions,
  CheckAllOptions,
  AcquireOptions,
  EntrySpec,
  Entries,
} from "./limiter.js";
export { LeaseHandle, LeaseLostError } from "./lease.js";
export type { LostReason } from "./lease.js";
export { COUNTER_NAMES } from "./policy.js";
export type { FailurePolicy, CounterName, CounterSnapshot, LimiterEvent } from "./policy.js";
export type { Mode } from "./protocol.js";
export type { SendCommand } from "./transport.js";
export { LUA_LIBRARY_TEXT, LIBRARY_NAME, LIBRARY_VERSION } from "./lua.js";
export { decisionHeaders } from "./headers.js";
export type { HeaderOptions } from "./headers.js";
