// The fastify plugin through fastify's real server against real redis-server processes (module
// and fallback): global rules and a route's own (config.rateLimit), route templates as keys,
// 404s under the default rule, @fastify/rate-limit's hooks, leases held for the request.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import Fastify, { type FastifyInstance } from "fastify";
import type { AddressInfo } from "node:net";
import { GCRA, Lease, Window, type RateLimiter } from "../src/index.js";
import {
  redisRateLimit,
  ipKey,
  headerKey,
  routeKey,
  reportCost,
  type ErrorResponseContext,
  userKey,
} from "../src/http/fastify.js";
import { Server, limiterFor, uniquePrefix } from "./harness.js";
import { send, sendAndAbandon, until } from "./http-helpers.js";

const hour = 3_600_000;
const policyOf = (r: { headers: Record<string, unknown> }) =>
  /^"([^"]+)"/.exec(String(r.headers["ratelimit"] ?? ""))?.[1];

for (const module of [true, false]) {
  describe(`fastify plugin (${module ? "module" : "fallback"})`, () => {
    let redis: Server;
    const closers: (() => Promise<void>)[] = [];
    before(async () => {
      redis = await new Server(module).start();
    });
    after(async () => {
      for (const c of closers.reverse()) await c();
      await redis.remove();
    });
    const limiter = async (
      name: string,
      options: Parameters<typeof limiterFor>[2] = {},
    ): Promise<RateLimiter> => {
      const l = await limiterFor("ioredis", redis.port, { prefix: uniquePrefix(name), ...options });
      closers.push(l.close);
      return l.limiter;
    };
    const serve = async (app: FastifyInstance): Promise<number> => {
      await app.listen({ port: 0, host: "127.0.0.1" });
      closers.push(() => app.close());
      return (app.server.address() as AddressInfo).port;
    };

    test("global rules, a route's own rules, rateLimit: false, route templates and 404s as keys", async () => {
      const l = await limiter("fastify routes");
      const app = Fastify();
      await app.register(redisRateLimit, {
        limiter: l,
        exemptPaths: ["/health"],
        rules: [
          { name: "per-route", limit: new GCRA({ burst: 2, rate: 2, periodMs: hour }), key: routeKey() },
        ],
      });
      app.get("/users/:id", async (request) => ({
        policy: request.rateLimit?.policy,
        remaining: request.rateLimit?.remaining,
      }));
      app.get("/health", async () => "ok");
      app.get("/open", { config: { rateLimit: false } }, async () => "open");
      app.get(
        "/login",
        { config: { rateLimit: { name: "login", limit: "1/hour", key: ipKey() } } },
        async (request) => request.rateLimit?.policy,
      );
      const port = await serve(app);
      const first = await send(port, "/users/1");
      assert.equal(first.status, 200);
      assert.deepEqual(first.body, { policy: "per-route", remaining: 1 });
      assert.equal(first.headers["ratelimit-policy"], '"per-route";q=2;w=3600');
      assert.equal((await send(port, "/users/2")).status, 200);
      const third = await send(port, "/users/3");
      assert.equal(third.status, 429, "one bucket for the template /users/:id");
      assert.match(String(third.headers["content-type"]), /^application\/json/);
      assert.match(
        third.text,
        /^\{"error": "rate_limited", "message": "too many requests", "policy": "per-route", "retry_after": \d+\}$/,
      );
      for (let i = 0; i < 3; i++) {
        assert.equal((await send(port, "/health")).headers["ratelimit"], undefined);
        const o = await send(port, "/open");
        assert.equal(o.status, 200);
        assert.equal(o.headers["ratelimit"], undefined);
      }
      const login = await send(port, "/login");
      assert.equal([login.status, login.text, policyOf(login)].join(), "200,login,login");
      assert.equal((await send(port, "/login")).status, 429);
      // Requests the router matched to no route: one "<METHOD> (no route)" bucket.
      const statuses = [];
      for (const p of ["/nope", "/other", "/third"]) statuses.push((await send(port, p)).status);
      assert.deepEqual(statuses, [404, 404, 429]);
    });

    test("errorResponseBuilder, onExceeding and onExceeded, as @fastify/rate-limit users write them", async () => {
      const l = await limiter("fastify hooks");
      const exceeding: string[] = [];
      const exceeded: string[] = [];
      const contexts: ErrorResponseContext[] = [];
      const app = Fastify();
      await app.register(redisRateLimit, {
        limiter: l,
        rules: [
          {
            name: "api",
            limit: new GCRA({ burst: 1, rate: 1, periodMs: 60_000 }),
            key: headerKey("x-api-key"),
          },
        ],
        onExceeding: (_r, key) => exceeding.push(key),
        onExceeded: (_r, key) => exceeded.push(key),
        errorResponseBuilder: (_request, context) => {
          contexts.push(context);
          return {
            statusCode: context.statusCode,
            error: "Too Many Requests",
            message: `retry in ${context.after}`,
          };
        },
      });
      app.get("/", async () => "ok");
      const port = await serve(app);
      const k = { headers: { "x-api-key": "k{1}" } };
      assert.equal((await send(port, "/", k)).status, 200);
      const r = await send(port, "/", k);
      assert.equal(r.status, 429);
      assert.deepEqual(r.body, {
        statusCode: 429,
        error: "Too Many Requests",
        message: "retry in 60 seconds",
      });
      assert.equal(r.headers["retry-after"], "60");
      assert.match(String(r.headers["ratelimit"]), /^"api";r=0;t=60$/);
      const key = `${l.prefix}api:{hdr.x-api-key:k%7B1%7D}`;
      assert.deepEqual(exceeding, [key]);
      assert.deepEqual(exceeded, [key]);
      assert.equal(contexts[0]!.max, 1);
      assert.ok(contexts[0]!.ttl > 59_000 && contexts[0]!.ttl <= 60_000);
      assert.equal(contexts[0]!.denial.policy, "api");
    });

    test("a lease is held for the request and released on client abort; global: false limits configured routes only", async () => {
      const l = await limiter("fastify lease");
      const app = Fastify();
      await app.register(redisRateLimit, {
        limiter: l,
        global: false,
        rules: [{ name: "unused", limit: new Window({ limit: 1, windowMs: hour }), key: ipKey() }],
      });
      let entered = 0;
      const slot = {
        config: {
          rateLimit: { name: "slot", limit: new Lease({ limit: 1, leaseMs: 60_000 }), key: ipKey() },
        },
      };
      app.get("/wait", slot, async (request) => {
        entered++;
        assert.ok(request.rateLimit?.lease("slot"));
        await new Promise((r) => request.raw.socket.once("close", r));
        return "late";
      });
      app.get("/quick", slot, async () => "quick");
      app.get("/free", async () => "free");
      const port = await serve(app);
      for (let i = 0; i < 3; i++) assert.equal((await send(port, "/free")).headers["ratelimit"], undefined);
      const q = await send(port, "/quick");
      assert.equal(q.status, 200);
      assert.equal(q.headers["ratelimit-policy"], '"slot";q=1;qu="concurrent-requests"');
      assert.equal((await send(port, "/quick")).status, 200, "released when the response finished");
      const abandoned = sendAndAbandon(port, "/wait", {}, 300);
      assert.ok(await until(() => entered === 1));
      const busy = await send(port, "/quick");
      assert.equal(busy.status, 429);
      assert.equal(busy.body?.["policy"], "slot");
      await abandoned;
      assert.ok(
        await until(async () => (await send(port, "/quick")).status === 200),
        "released when the client went away",
      );
    });

    test("deductWhen and reportCost settle on the status fastify sends", async () => {
      const l = await limiter("fastify settle");
      const g = new GCRA({ burst: 3, rate: 3, periodMs: hour });
      const app = Fastify();
      await app.register(redisRateLimit, {
        limiter: l,
        rules: [{ name: "settle", limit: g, key: ipKey(), deductWhen: (status) => status < 500 }],
      });
      app.get("/fail", async (_request, reply) => reply.code(502).send("bad gateway"));
      app.get("/free", async (request) => {
        reportCost(request, 0);
        return "free";
      });
      app.get("/ok", async () => "ok");
      const port = await serve(app);
      for (let i = 0; i < 3; i++) assert.equal((await send(port, "/fail")).status, 502);
      for (let i = 0; i < 3; i++) assert.equal((await send(port, "/free")).status, 200);
      const ok = [];
      for (let i = 0; i < 4; i++) ok.push((await send(port, "/ok")).status);
      assert.deepEqual(ok, [200, 200, 200, 429], "neither failed nor free requests were charged");
    });

    test('hook: "preHandler" keys on what authentication set', async () => {
      const l = await limiter("fastify preHandler");
      const app = Fastify();
      app.decorateRequest("user", null);
      app.addHook("onRequest", async (request) => {
        (request as unknown as { user: string | null }).user =
          String(request.headers["authorization"] ?? "") || null;
      });
      await app.register(redisRateLimit, {
        limiter: l,
        hook: "preHandler",
        rules: [
          {
            name: "per-user",
            limit: new GCRA({ burst: 1, rate: 1, periodMs: hour }),
            key: userKey((r) => (r as unknown as { user: string | null }).user),
            missing: "deny",
          },
        ],
      });
      app.get("/", async () => "ok");
      const port = await serve(app);
      const as = (u: string) => ({ headers: { authorization: u } });
      assert.deepEqual(
        [
          await send(port, "/", as("ann")),
          await send(port, "/", as("ann")),
          await send(port, "/", as("bob")),
          await send(port, "/"),
        ].map((r) => r.status),
        [200, 429, 200, 401],
      );
    });

    test("options are checked when the plugin is registered and when a route is declared", async () => {
      const l = await limiter("fastify options");
      const a = Fastify();
      await assert.rejects(
        async () => {
          await a.register(redisRateLimit, { limiter: l, rules: [], max: 3 } as never);
          await a.ready();
        },
        { code: "ERR_RL_UNKNOWN_OPTION" },
      );
      const b = Fastify();
      await b.register(redisRateLimit, { limiter: l, rules: [] });
      assert.throws(
        () =>
          b.get(
            "/x",
            { config: { rateLimit: { name: "x", limit: "1/eon", key: ipKey() } } },
            async () => "x",
          ),
        { code: "ERR_RL_INVALID_LIMIT" },
      );
      await b.close();
      await a.close().catch(() => {});
    });
  });
}

describe("fastify plugin, Redis stopped mid-run", () => {
  let redis: Server;
  const closers: (() => Promise<void>)[] = [];
  before(async () => {
    redis = await new Server(true).start();
  });
  after(async () => {
    for (const c of closers.reverse()) await c();
    await redis.remove();
  });

  test("closed answers 503 without RateLimit fields, open admits without them", async () => {
    const ports: number[] = [];
    for (const onError of ["closed", "open"] as const) {
      const { limiter, close } = await limiterFor("ioredis", redis.port, {
        prefix: uniquePrefix(onError),
        onError,
        timeoutMs: 300,
        probeIntervalMs: 50,
      });
      closers.push(close);
      const app = Fastify();
      await app.register(redisRateLimit, {
        limiter,
        rules: [{ name: "api", limit: "100/hour", key: ipKey() }],
      });
      app.get("/", async () => "ok");
      await app.listen({ port: 0, host: "127.0.0.1" });
      closers.push(() => app.close());
      ports.push((app.server.address() as AddressInfo).port);
    }
    const [pc, po] = ports as [number, number];
    assert.ok((await send(pc, "/")).headers["ratelimit"]);
    await redis.kill();
    const c = await send(pc, "/");
    assert.equal(c.status, 503);
    assert.equal(c.headers["retry-after"], "1");
    assert.equal(c.headers["ratelimit"], undefined);
    assert.equal(c.body?.["error"], "limiter_unavailable");
    const o = await send(po, "/");
    assert.equal(o.status, 200);
    assert.equal(o.headers["ratelimit"], undefined);
    await redis.start();
    assert.ok(await until(async () => (await send(pc, "/")).headers["ratelimit"] !== undefined));
  });
});
