// redis-rl/http: the framework-neutral HTTP core under the express and fastify adapters.
export {
  HttpLimiter,
  ipKey,
  headerKey,
  routeKey,
  userKey,
  fnKey,
  namedLimits,
  headerCost,
  sendDenial,
  headerLines,
  reportCost,
  recordable,
} from "./core.js";
export type {
  Awaitable,
  Denial,
  HttpEvent,
  HttpOptions,
  Key,
  LimitEntry,
  LimitInput,
  Outcome,
  RateLimitInfo,
  RequestView,
  Rule,
  WarningCode,
} from "./core.js";
export { ClientIp, UNKNOWN_IP } from "./clientip.js";
export type { ClientIpOptions, ClientAddress } from "./clientip.js";
export { safeKeyPart, identityKey, normalizeList } from "./keys.js";
export { normalizePath, matchPath } from "./paths.js";
