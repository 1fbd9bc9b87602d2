// The express middleware (express 4 and 5): a thin adapter over the HTTP core (core.ts).
// `app.use(rateLimit(limiter, {rules: [...]}))`; denials answered the core's way unless a
// `handler(req, res, next, denial)` answers them, as express-rate-limit's handler does.

import type { IncomingMessage, ServerResponse } from "node:http";
import { badOption } from "../errors.js";
import type { RateLimiter } from "../limiter.js";
import {
  HttpLimiter,
  headerLines,
  sendDenial,
  sendLimiterError,
  type Denial,
  type HttpOptions,
  type RequestView,
} from "./core.js";

// req.rateLimit is typed for express users by express-request.d.ts (a global augmentation of
// Express.Request, declared once for ESM and CommonJS consumers alike: scripts/finish-build.mjs).

/** The parts of an express request the middleware reads (express's Request has them all). */
export interface ExpressRequest extends IncomingMessage {
  ip?: string | undefined;
  originalUrl?: string;
  baseUrl?: string;
  route?: { path?: unknown } | undefined;
  app?: { get(setting: string): unknown } | undefined;
}

export type NextFunction = (err?: unknown) => void;

/** Options of rateLimit: the core's, and express's own ways to answer a denial. */
export interface ExpressRateLimitOptions<
  Req extends ExpressRequest = ExpressRequest,
> extends HttpOptions<Req> {
  /**
   * Answers a denied request instead of the default JSON answer (429, 413, 503 or 401: see
   * denial.status; denial.headers holds the fields to send), as express-rate-limit's
   * handler: send a response, or call next (with an error, to let express's error handler
   * answer).
   */
  handler?: (req: Req, res: ServerResponse, next: NextFunction, denial: Denial) => unknown;
  /** Told of every denial before it is answered (logging, metrics). */
  onLimit?: (req: Req, res: ServerResponse, denial: Denial) => void;
  /** Where the admitted request's RateLimitInfo goes: req[requestPropertyName] (default "rateLimit"). */
  requestPropertyName?: string;
}

/** An express middleware built by rateLimit, with the core it runs. */
export type RateLimitMiddleware<Req extends ExpressRequest = ExpressRequest> = ((
  req: Req,
  res: ServerResponse,
  next: NextFunction,
) => void) & { readonly core: HttpLimiter<Req> };

function trustsProxies(req: ExpressRequest): boolean {
  const t = req.app?.get?.("trust proxy");
  return t !== undefined && t !== null && t !== false && t !== 0 && t !== "";
}

function view(req: ExpressRequest): RequestView {
  const routePath = req.route?.path;
  return {
    method: req.method ?? "GET",
    target: req.originalUrl ?? req.url ?? "/",
    header: headerLines(req),
    peer: req.socket?.remoteAddress,
    frameworkIp: req.ip,
    route: typeof routePath === "string" ? (req.baseUrl ?? "") + routePath : undefined,
    routed: false,
    frameworkTrustsProxies: trustsProxies(req),
  };
}

/**
 * The express middleware: limits the requests its rules match (first match wins), answers a
 * refused one (429 with Retry-After and the RateLimit fields, 413 for one that can never pass,
 * 503 without fields when the limiter cannot decide under the closed policy, 401 for a missing
 * identity under `missing: "deny"`), and puts the RateLimit fields on every admitted response
 * and the decision on req.rateLimit. Options are checked now: an unknown one is refused with
 * a RateLimitConfigError (code ERR_RL_UNKNOWN_OPTION).
 */
export function rateLimit<Req extends ExpressRequest = ExpressRequest>(
  limiter: RateLimiter,
  options: ExpressRateLimitOptions<Req>,
): RateLimitMiddleware<Req> {
  const core = new HttpLimiter<Req>(
    limiter,
    options,
    ["handler", "onLimit", "requestPropertyName"],
    "rateLimit (express)",
  );
  for (const f of ["handler", "onLimit"] as const) {
    if (options[f] !== undefined && typeof options[f] !== "function") {
      throw badOption(`rateLimit (express): ${f} must be a function`);
    }
  }
  const prop = options.requestPropertyName ?? "rateLimit";
  if (typeof prop !== "string" || prop === "") {
    throw badOption("rateLimit (express): requestPropertyName must be a non-empty string");
  }
  const { handler, onLimit } = options;
  const middleware = (req: Req, res: ServerResponse, next: NextFunction): void => {
    core.run(req, view(req), res).then(
      (o) => {
        switch (o.kind) {
          case "pass":
            return next();
          case "admit":
            for (const [k, v] of Object.entries(o.headers)) res.setHeader(k, v);
            (req as unknown as Record<string, unknown>)[prop] = o.info;
            return next();
          case "deny":
            if (onLimit) onLimit(req, res, o.denial);
            if (handler) {
              return void Promise.resolve(handler(req, res, next, o.denial)).catch(next);
            }
            return sendDenial(res, o.denial);
          case "error":
            return sendLimiterError(res, o.body);
          case "gone":
            return;
        }
      },
      (err) => next(err),
    );
  };
  return Object.assign(middleware, { core });
}

export * from "./index.js";
