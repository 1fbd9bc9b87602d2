// req.rateLimit, typed for express users. @types/express builds its Request from the global
// Express.Request, so merging into that interface reaches every handler, and costs nothing
// when @types/express is absent. This is a script (no import or export), referenced from both
// dist/esm/http/express.d.ts and dist/cjs/http/express.d.ts (scripts/finish-build.mjs): one
// declaration whichever way the package is loaded, so a program that loads both builds does
// not see two conflicting declarations of the property. Under another requestPropertyName the
// decision is at that name instead (untyped).
declare namespace Express {
  interface Request {
    /**
     * redis-rl: the admitted request's decision (the binding limit, remaining, used,
     * resetTime, the decision itself and its leases); absent when no rule matched it.
     */
    rateLimit?: import("./core.js").RateLimitInfo;
  }
}
