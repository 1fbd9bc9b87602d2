// The fastify plugin (fastify 4 and 5): a thin adapter over the HTTP core (core.ts), wrapped
// with fastify-plugin so its hook covers the whole application (404s included). Per-route
// rules in a route's config.rateLimit (false exempts the route), @fastify/rate-limit's
// errorResponseBuilder, onExceeding and onExceeded hooks.

import type {
  FastifyInstance,
  FastifyPluginAsync,
  FastifyReply,
  FastifyRequest,
  RouteOptions,
} from "fastify";
import { fastifyPlugin } from "fastify-plugin";
import { badOption, refuseUnknown, usage } from "../errors.js";
import { RateLimiter } from "../limiter.js";
import {
  HttpLimiter,
  HTTP_OPTIONS,
  headerLines,
  type Denial,
  type HttpOptions,
  type RateLimitInfo,
  type RequestView,
  type Rule,
} from "./core.js";

/** A route's own limits: a rule (it applies to every request of the route), or several. */
export type RouteRateLimit = Omit<Rule<FastifyRequest>, "path"> | { rules: readonly Rule<FastifyRequest>[] };

declare module "fastify" {
  interface FastifyContextConfig {
    /** redis-rl: false exempts the route; a rule (or {rules}) replaces the plugin's rules for it. */
    rateLimit?: RouteRateLimit | false;
  }
  interface FastifyRequest {
    /** redis-rl: the admitted request's decision. */
    rateLimit?: RateLimitInfo | null;
  }
}

/** What errorResponseBuilder gets, as @fastify/rate-limit's context, with the denial. */
export interface ErrorResponseContext {
  statusCode: number;
  /** Always false (this plugin does not ban). */
  ban: false;
  /** The binding limit. */
  max: number;
  /** ms until the request may pass (Infinity for a 413). */
  ttl: number;
  /** Retry-After in words: "3 seconds". */
  after: string;
  denial: Denial;
}

/** Options of the plugin: the core's, the limiter, and fastify's own ways to answer. */
export interface FastifyRateLimitOptions extends HttpOptions<FastifyRequest> {
  limiter: RateLimiter;
  /** The plugin's rules apply to every route (default); false: only routes with config.rateLimit. */
  global?: boolean;
  /** The hook the limiter runs in: "onRequest" (default) or "preHandler" (after authentication, with the body parsed). */
  hook?: "onRequest" | "preHandler";
  /**
   * Builds what a denial throws (fastify's error handling answers it, with the status of the
   * denial unless it carries its own statusCode), as @fastify/rate-limit's; the default
   * answers the core's JSON body.
   */
  errorResponseBuilder?: (request: FastifyRequest, context: ErrorResponseContext) => unknown;
  /** Called with the binding key for an admitted request. */
  onExceeding?: (request: FastifyRequest, key: string) => void;
  /** Called with the binding key for a request refused 429 or 413. */
  onExceeded?: (request: FastifyRequest, key: string) => void;
}

const OWN = ["limiter", "global", "hook", "errorResponseBuilder", "onExceeding", "onExceeded"];
// What fastify's register passes along with a plugin's options.
const REGISTER = ["prefix", "logLevel", "logSerializers"];

function seconds(n: number): string {
  return n === 1 ? "1 second" : `${n} seconds`;
}

function routeRules(cfg: RouteRateLimit, where: string): readonly Rule<FastifyRequest>[] {
  if ("rules" in cfg) {
    refuseUnknown(cfg, ["rules"], where);
    return cfg.rules;
  }
  return [cfg as Rule<FastifyRequest>];
}

const plugin: FastifyPluginAsync<FastifyRateLimitOptions> = async (fastify: FastifyInstance, opts) => {
  refuseUnknown(opts, [...HTTP_OPTIONS, ...OWN, ...REGISTER], "the redis-rl fastify plugin");
  const { limiter } = opts;
  if (!(limiter instanceof RateLimiter))
    throw usage("the redis-rl fastify plugin needs {limiter: a RateLimiter}");
  const coreOptions: Record<string, unknown> = {};
  for (const k of HTTP_OPTIONS)
    if ((opts as unknown as Record<string, unknown>)[k] !== undefined)
      coreOptions[k] = (opts as unknown as Record<string, unknown>)[k];
  const core = new HttpLimiter<FastifyRequest>(
    limiter,
    { rules: [], ...coreOptions } as HttpOptions<FastifyRequest>,
    [],
    "the redis-rl fastify plugin",
  );
  const global = opts.global ?? true;
  const hook = opts.hook ?? "onRequest";
  if (typeof global !== "boolean") throw badOption("the redis-rl fastify plugin: global must be a boolean");
  if (hook !== "onRequest" && hook !== "preHandler") {
    throw badOption(
      `the redis-rl fastify plugin: hook must be "onRequest" or "preHandler", not ${JSON.stringify(hook)}`,
    );
  }
  for (const f of ["errorResponseBuilder", "onExceeding", "onExceeded"] as const) {
    if (opts[f] !== undefined && typeof opts[f] !== "function") {
      throw badOption(`the redis-rl fastify plugin: ${f} must be a function`);
    }
  }
  const { errorResponseBuilder, onExceeding, onExceeded } = opts;
  const trustProxy = Boolean((fastify.initialConfig as { trustProxy?: unknown }).trustProxy);
  // A route's rules, compiled (and their names checked) when the route is declared.
  const compiled = new WeakMap<object, ReturnType<HttpLimiter<FastifyRequest>["compile"]>>();
  const compile = (cfg: RouteRateLimit, label: string) => {
    let c = compiled.get(cfg);
    if (!c) {
      if (typeof cfg !== "object" || cfg === null) {
        throw badOption(`route ${label}: config.rateLimit must be false, a rule or {rules: [...]}`);
      }
      c = core.compile(routeRules(cfg, `route ${label}'s config.rateLimit`), label);
      compiled.set(cfg, c);
    }
    return c;
  };
  fastify.decorateRequest("rateLimit", null);
  fastify.addHook("onRoute", (route: RouteOptions) => {
    const cfg = (route.config as { rateLimit?: unknown } | undefined)?.rateLimit;
    if (cfg === undefined || cfg === false) return;
    const method = Array.isArray(route.method) ? route.method.join(",") : route.method;
    compile(cfg as RouteRateLimit, `${method} ${route.url}`);
  });

  fastify.addHook(hook, async (request: FastifyRequest, reply: FastifyReply) => {
    const ro = request.routeOptions;
    const cfg = (ro?.config as { rateLimit?: unknown } | undefined)?.rateLimit;
    if (cfg === false) return;
    let rules: ReturnType<typeof compile> | undefined;
    if (cfg !== undefined && cfg !== null) rules = compile(cfg as RouteRateLimit, `${ro.method} ${ro.url}`);
    else if (!global) return;
    const raw = request.raw;
    const view: RequestView = {
      method: request.method,
      target: raw.url ?? request.url,
      header: headerLines(raw),
      peer: raw.socket?.remoteAddress,
      frameworkIp: request.ip,
      route: ro?.url,
      routed: true,
      frameworkTrustsProxies: trustProxy,
    };
    const o = await core.run(request, view, reply.raw, rules);
    switch (o.kind) {
      case "pass":
      case "gone":
        return;
      case "admit":
        reply.headers(o.headers);
        request.rateLimit = o.info;
        if (onExceeding) onExceeding(request, o.info.key);
        return;
      case "error":
        return reply.code(500).type("application/json").send(o.body);
      case "deny": {
        const d = o.denial;
        if (onExceeded && (d.status === 429 || d.status === 413)) onExceeded(request, d.key);
        reply.headers(d.headers);
        reply.code(d.status);
        if (errorResponseBuilder) {
          const retry = d.retryAfter ?? 0;
          throw errorResponseBuilder(request, {
            statusCode: d.status,
            ban: false,
            max: d.decision?.limit ?? 0,
            ttl: d.decision?.never ? Infinity : (d.decision?.retryAfterMs ?? 0),
            after: seconds(retry),
            denial: d,
          });
        }
        return reply.type("application/json").send(d.body);
      }
    }
  });
};

/**
 * The redis-rl fastify plugin: `await app.register(redisRateLimit, {limiter, rules: [...]})`.
 * Its hook (onRequest unless `hook: "preHandler"`) limits the requests its rules match, or a
 * route's own rules (`config: {rateLimit: {name, limit, key}}`; `rateLimit: false` exempts
 * the route); admitted requests carry the RateLimit fields and request.rateLimit. Options
 * are checked when registered: an unknown one is refused (ERR_RL_UNKNOWN_OPTION).
 */
export const redisRateLimit = fastifyPlugin(plugin, { fastify: ">=4", name: "redis-rl" });
export default redisRateLimit;

export * from "./index.js";
