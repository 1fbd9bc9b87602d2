// The express middleware through express's real servers (express 5, and express 4 where it
// is cheap), against real redis-server processes with the module and without it (fallback):
// docs/clients.md#web-middleware and its decided details.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server as HttpServer, type ServerResponse } from "node:http";
import { join } from "node:path";
import express from "express";
import express4 from "express4";
import { GCRA, Lease, Window, type RateLimiter, type LeaseHandle } from "../src/index.js";
import {
  rateLimit,
  ipKey,
  headerKey,
  routeKey,
  reportCost,
  identityKey,
  type Denial,
  type RateLimitInfo,
  type HttpEvent,
} from "../src/http/express.js";
import { Server, limiterFor, uniquePrefix } from "./harness.js";
import { send, sendAndAbandon, listen, close, until, sleep } from "./http-helpers.js";

type App = ReturnType<typeof express>;

const hour = 3_600_000;

const RUNS = [
  { module: true, ex: express, version: 5 },
  { module: false, ex: express, version: 5 },
  { module: true, ex: express4, version: 4 },
];

for (const { module, ex, version } of RUNS) {
  describe(`express ${version} middleware (${module ? "module" : "fallback"})`, () => {
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
    const serve = async (app: App): Promise<number> => {
      const s: HttpServer = createServer(app);
      const port = await listen(s);
      closers.push(() => close(s));
      return port;
    };

    test("two servers on two ports (express 5 and express 4) share one limit", async () => {
      const l = await limiter("two servers");
      const mw = rateLimit(l, {
        rules: [{ name: "api", limit: new GCRA({ burst: 5, rate: 5, periodMs: hour }), key: ipKey() }],
      });
      const a = ex();
      const b = express4();
      for (const app of [a, b]) {
        app.use(mw);
        app.get("/x", (req, res) => {
          const info = req.rateLimit; // typed by express.ts's Express.Request augmentation
          assert.ok(info);
          res.json({ remaining: info.remaining, policy: info.policy, allowed: info.decision.allowed });
        });
      }
      const ports = [await serve(a), await serve(b as unknown as App)];
      for (let i = 0; i < 5; i++) {
        const r = await send(ports[i % 2]!, "/x");
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.body, { remaining: 4 - i, policy: "api", allowed: true });
        assert.equal(r.headers["ratelimit-policy"], '"api";q=5;w=3600');
        assert.match(String(r.headers["ratelimit"]), new RegExp(`^"api";r=${4 - i};t=\\d+$`));
        assert.equal(r.headers["retry-after"], undefined);
      }
      for (const port of ports) {
        const r = await send(port, "/x");
        assert.equal(r.status, 429);
        assert.equal(r.headers["content-type"], "application/json");
        const retry = Number(r.headers["retry-after"]);
        assert.ok(retry >= 719 && retry <= 720, String(retry));
        assert.equal(
          r.text,
          `{"error": "rate_limited", "message": "too many requests", "policy": "api", "retry_after": ${retry}}`,
        );
        assert.equal(r.headers["ratelimit-policy"], '"api";q=5;w=3600');
        assert.match(String(r.headers["ratelimit"]), /^"api";r=0;t=\d+$/);
      }
    });

    test("per-route rules, exempt paths that /static/../api does not escape, CORS preflights, 404s under the default rule", async () => {
      const l = await limiter("routes");
      const app = ex();
      app.use(
        rateLimit(l, {
          exemptPaths: ["/health", "/static/*"],
          rules: [
            {
              name: "login",
              path: "/login",
              methods: ["post"],
              limit: new GCRA({ burst: 2, rate: 2, periodMs: hour }),
              key: ipKey(),
            },
            { name: "api", path: "/api/", limit: "3 per hour", key: ipKey() },
            { name: "default", limit: new Window({ limit: 100, windowMs: hour }), key: ipKey() },
          ],
        }),
      );
      app.get("/health", (_q, res) => res.send("ok"));
      app.get("/static/a.css", (_q, res) => res.send("css"));
      app.get("/api/x", (_q, res) => res.send("x"));
      app.options("/api/x", (_q, res) => res.send("preflight"));
      app.post("/login", (_q, res) => res.send("in"));
      app.get("/login", (_q, res) => res.send("form"));
      const port = await serve(app);
      const policyOf = (r: { headers: Record<string, unknown> }) =>
        /^"([^"]+)"/.exec(String(r.headers["ratelimit"] ?? ""))?.[1];
      const calls = l.counters.redisCalls;
      for (const p of ["/health", "/health/", "//health", "/static/a.css", "/static/x/../a.css"]) {
        const r = await send(port, p);
        assert.equal(r.headers["ratelimit"], undefined, p);
      }
      assert.equal(l.counters.redisCalls, calls, "exempt paths make no Redis call");
      // A preflight is exempt; an OPTIONS that is no preflight is not.
      const pre = await send(port, "/api/x", {
        method: "OPTIONS",
        headers: { origin: "https://a.example", "access-control-request-method": "GET" },
      });
      assert.equal(pre.status, 200);
      assert.equal(pre.headers["ratelimit"], undefined);
      // Every spelling of /api/x counts in the one "api" bucket, /static/../api/x included.
      const spellings = ["/api/x", "/api//x/", "/static/../api/x", "/static/%2e%2e/api/x"];
      const seen: (number | string | undefined)[] = [];
      for (const p of spellings) {
        const r = await send(port, p);
        seen.push(r.status === 429 ? 429 : policyOf(r));
      }
      assert.deepEqual(seen, ["api", "api", "api", 429]);
      const opt = await send(port, "/api/x", { method: "OPTIONS", headers: { origin: "https://a.example" } });
      assert.equal(opt.status, 429, "an OPTIONS without Access-Control-Request-Method is limited");
      // Methods: POST /login under "login", GET /login under the default rule.
      assert.deepEqual(
        [
          await send(port, "/login", { method: "POST" }),
          await send(port, "/login", { method: "POST" }),
          await send(port, "/login", { method: "POST" }),
        ].map((r) => r.status),
        [200, 200, 429],
      );
      const form = await send(port, "/login");
      assert.equal([form.status, policyOf(form)].join(), "200,default");
      const missing = await send(port, "/nowhere");
      assert.equal([missing.status, policyOf(missing)].join(), "404,default");
    });

    test("413 for what can never pass: a cost above the limit (with the fields), 2^64 or more (no Redis call)", async () => {
      const l = await limiter("never");
      const app = ex();
      app.use(
        rateLimit(l, {
          rules: [
            {
              name: "big",
              limit: new Window({ limit: 10, windowMs: hour }),
              key: ipKey(),
              costHeader: "x-cost",
            },
          ],
        }),
      );
      app.get("/", (_q, res) => res.send("ok"));
      const port = await serve(app);
      const ok = await send(port, "/", { headers: { "x-cost": "4" } });
      assert.equal(ok.status, 200);
      assert.match(String(ok.headers["ratelimit"]), /^"big";r=6;t=\d+$/);
      const body =
        '{"error": "request_too_large", "message": "this request asks for more than the limit allows and can never pass", "policy": "big"}';
      const r = await send(port, "/", { headers: { "x-cost": "11" } });
      assert.equal(r.status, 413);
      assert.equal(r.text, body);
      assert.equal(r.headers["retry-after"], undefined);
      assert.equal(r.headers["ratelimit-policy"], '"big";q=10;w=3600');
      const calls = l.counters.redisCalls;
      const huge = await send(port, "/", { headers: { "x-cost": "18446744073709551616" } });
      assert.equal(huge.status, 413);
      assert.equal(huge.text, body);
      assert.equal(huge.headers["ratelimit"], undefined);
      assert.equal(l.counters.redisCalls, calls);
    });

    test("trusted proxies name the client, rightmost first; express's trust proxy through fromFramework", async () => {
      const events: HttpEvent[] = [];
      const l = await limiter("proxies");
      const rule = { name: "per-ip", limit: new GCRA({ burst: 1, rate: 1, periodMs: hour }), key: ipKey() };
      const own = ex();
      own.use(rateLimit(l, { clientIp: { trustedProxies: ["127.0.0.0/8"] }, rules: [rule] }));
      const framework = ex();
      framework.set("trust proxy", "loopback");
      framework.use(rateLimit(l, { clientIp: { fromFramework: true }, rules: [rule] }));
      const ignored = ex();
      ignored.set("trust proxy", "loopback");
      ignored.use(rateLimit(l, { rules: [{ ...rule, name: "peer" }], onEvent: (e) => events.push(e) }));
      for (const app of [own, framework, ignored]) app.get("/", (_q, res) => res.send("ok"));
      const [p1, p2, p3] = [await serve(own), await serve(framework), await serve(ignored)];
      const xff = (v: string) => ({ headers: { "x-forwarded-for": v } });
      assert.equal((await send(p1, "/", xff("203.0.113.5"))).status, 200);
      // A spoofed entry at the left changes nothing; the same client through the other app shares the bucket.
      assert.equal((await send(p1, "/", xff("6.6.6.6, 203.0.113.5"))).status, 429);
      assert.equal((await send(p2, "/", xff("7.7.7.7, 203.0.113.5"))).status, 429);
      assert.equal((await send(p2, "/", xff("203.0.113.6"))).status, 200);
      assert.equal((await send(p1, "/", xff("203.0.113.6"))).status, 429);
      // IPv6 clients by their /64.
      assert.equal((await send(p1, "/", xff("2001:db8:1:2::1"))).status, 200);
      assert.equal((await send(p2, "/", xff("2001:db8:1:2:ffff::9"))).status, 429);
      // An unusable value falls back to the peer (127.0.0.1) and is counted.
      const before = l.counters.forwardedUnusable;
      assert.equal((await send(p1, "/", xff("garbage"))).status, 200);
      assert.equal((await send(p1, "/", xff(":80"))).status, 429, "the peer's bucket");
      assert.equal(l.counters.forwardedUnusable, before + 2);
      // trust proxy set, clientIp trusting none: keyed by the peer, and warned once.
      assert.equal((await send(p3, "/", xff("198.51.100.1"))).status, 200);
      assert.equal((await send(p3, "/", xff("198.51.100.2"))).status, 429);
      assert.deepEqual(
        events.map((e) => e.type === "warning" && e.code),
        ["framework-trusts-proxies"],
      );
    });

    test("deductWhen refunds on the status sent; a client gone before a status stays charged", async () => {
      const l = await limiter("deduct");
      const app = ex();
      app.use(
        rateLimit(l, {
          rules: [
            {
              name: "ok-only",
              limit: new GCRA({ burst: 2, rate: 2, periodMs: hour }),
              key: ipKey(),
              deductWhen: (s) => s < 500,
            },
          ],
        }),
      );
      app.get("/fail", (_q, res) => res.status(503).send("down"));
      app.get("/boom", () => {
        throw new Error("boom");
      });
      app.get("/ok", (_q, res) => res.send("ok"));
      app.get("/hang", () => {});
      const port = await serve(app);
      for (let i = 0; i < 4; i++)
        assert.equal((await send(port, i % 2 ? "/boom" : "/fail")).status, i % 2 ? 500 : 503);
      assert.deepEqual(
        [
          (await send(port, "/ok")).status,
          (await send(port, "/ok")).status,
          (await send(port, "/ok")).status,
        ],
        [200, 200, 429],
      );
      const l2 = await limiter("deduct gone");
      const app2 = ex();
      app2.use(
        rateLimit(l2, {
          rules: [
            {
              name: "ok-only",
              limit: new GCRA({ burst: 2, rate: 2, periodMs: hour }),
              key: ipKey(),
              deductWhen: () => false,
            },
          ],
        }),
      );
      app2.get("/hang", () => {});
      app2.get("/ok", (_q, res) => res.send("ok"));
      const port2 = await serve(app2);
      await sendAndAbandon(port2, "/hang", {}, 200);
      await sendAndAbandon(port2, "/hang", {}, 200);
      assert.equal((await send(port2, "/ok")).status, 429, "requests whose client went away stay charged");
    });

    test("a cost the handler reports settles the charge on the status: the extra recorded (not on LOG), the rest refunded", async () => {
      const l = await limiter("report");
      const events: HttpEvent[] = [];
      const tok = new GCRA({ burst: 10, rate: 10, periodMs: hour });
      const log = new Window({ limit: 10, windowMs: hour, algorithm: "LOG" });
      const app = ex();
      app.use(
        rateLimit(l, {
          onEvent: (e) => events.push(e),
          rules: [
            {
              name: "huge",
              path: "/huge",
              limit: new Window({ limit: 10, windowMs: hour, algorithm: "FIXED" }),
              key: ipKey(),
            },
            {
              name: "tokens",
              limits: [
                { name: "tok", limit: tok, key: ipKey() },
                { name: "tok-log", limit: log, key: ipKey() },
              ],
            },
          ],
        }),
      );
      app.get("/use", (req, res) => {
        assert.equal(reportCost(req, BigInt(String(req.query["n"]))), true);
        res.send("used");
        assert.equal(reportCost(req, 1), false, "once the status is sent");
      });
      app.get("/huge", (req, res) => {
        reportCost(req, 18446744073709551615n);
        res.send("huge");
      });
      const port = await serve(app);
      const left = async () => [
        (await l.check(identityKey("tok", "ip", "127.0.0.1"), tok, { cost: 0 })).remaining,
        (await l.check(identityKey("tok-log", "ip", "127.0.0.1"), log, { cost: 0 })).remaining,
      ];
      assert.equal((await send(port, "/use?n=5")).status, 200);
      assert.deepEqual(await left(), [5, 9], "4 more recorded on the GCRA limit, none on LOG");
      assert.equal((await send(port, "/use?n=0")).status, 200);
      assert.deepEqual(await left(), [5, 9], "the whole charge refunded, on both");
      const errors = l.counters.errors;
      assert.equal((await send(port, "/huge")).status, 200);
      assert.equal((await send(port, "/huge")).status, 429, "recorded as the most the window holds");
      assert.equal(l.counters.errors, errors + 1);
      assert.deepEqual(
        events.map((e) => e.type === "warning" && e.code),
        ["log-extra-left-out", "reported-cost-saturated"],
      );
      assert.equal(reportCost({}, 1), false);
    });

    test("a lease rule is held for the request and released when it ends: finished, failed, or the client gone", async () => {
      const l = await limiter("lease");
      const app = ex();
      app.use(
        rateLimit(l, {
          rules: [
            {
              name: "jobs",
              limits: [
                { name: "rate", limit: new Window({ limit: 100, windowMs: hour }), key: headerKey("x-user") },
                { name: "jobs", limit: new Lease({ limit: 1, leaseMs: 60_000 }), key: headerKey("x-user") },
              ],
            },
          ],
        }),
      );
      let entered = 0;
      let held: LeaseHandle | undefined;
      let release: (() => void) | undefined;
      app.get("/hold", (req, res) => {
        entered++;
        held = (req as unknown as { rateLimit: RateLimitInfo }).rateLimit.lease("jobs");
        release = () => res.send("held");
      });
      app.get("/wait", () => {
        entered++;
      });
      app.get("/boom", () => {
        throw new Error("boom");
      });
      app.get("/quick", (_q, res) => res.send("quick"));
      const port = await serve(app);
      const u1 = { headers: { "x-user": "u1" } };
      const holding = send(port, "/hold", u1);
      assert.ok(await until(() => entered === 1));
      assert.ok(held && held.lost === undefined);
      const busy = await send(port, "/quick", u1);
      assert.equal(busy.status, 429);
      assert.equal(busy.body?.["policy"], "jobs");
      assert.ok(Number(busy.headers["retry-after"]) >= 1);
      assert.equal(
        (await send(port, "/quick", { headers: { "x-user": "u2" } })).status,
        200,
        "another user's slot",
      );
      release!();
      assert.equal((await holding).status, 200);
      const q = await send(port, "/quick", u1);
      assert.equal(q.status, 200, "released when the response finished");
      assert.match(
        String(q.headers["ratelimit-policy"]),
        /"rate";q=100;w=3600, "jobs";q=1;qu="concurrent-requests"/,
      );
      assert.equal((await send(port, "/boom", u1)).status, 500);
      assert.equal((await send(port, "/quick", u1)).status, 200, "released when the handler failed");
      const abandoned = sendAndAbandon(port, "/wait", u1.headers, 300);
      assert.ok(await until(() => entered === 2));
      assert.equal((await send(port, "/quick", u1)).status, 429, "held while the request runs");
      await abandoned;
      assert.ok(
        await until(async () => (await send(port, "/quick", u1)).status === 200),
        "released when the client went away",
      );
    });

    test("a missing identity: the client IP by default, 401 under deny, counted skip; the denial handler and onLimit", async () => {
      const l = await limiter("missing");
      const w = new GCRA({ burst: 1, rate: 1, periodMs: hour });
      const denials: Denial[] = [];
      const app = ex();
      const custom = rateLimit(l, {
        rules: [{ name: "custom", path: "/custom", limit: w, key: ipKey() }],
        onLimit: (_req, _res, d) => denials.push(d),
        handler: (_req, res: ServerResponse, _next, d) => {
          res.setHeader("Retry-After", String(d.retryAfter));
          res.statusCode = 418;
          res.end(`slow down, ${d.policy}`);
        },
        requestPropertyName: "limits",
      });
      app.use(custom);
      app.use(
        rateLimit(l, {
          rules: [
            { name: "deny", path: "/deny", limit: w, key: headerKey("x-api-key"), missing: "deny" },
            { name: "skip", path: "/skip", limit: w, key: headerKey("x-api-key"), missing: "skip" },
            { name: "fallback", path: "/fallback", limit: w, key: headerKey("x-api-key") },
          ],
        }),
      );
      app.get("/custom", (req, res) =>
        res.send(String((req as unknown as { limits?: RateLimitInfo }).limits?.policy)),
      );
      for (const p of ["/deny", "/skip", "/fallback"]) app.get(p, (_q, res) => res.send("ok"));
      const port = await serve(app);
      const first = await send(port, "/custom");
      assert.equal(first.text, "custom");
      const r = await send(port, "/custom");
      assert.equal([r.status, r.text].join(), "418,slow down, custom");
      assert.equal(denials.length, 1);
      assert.equal(denials[0]!.status, 429);
      const d = await send(port, "/deny");
      assert.equal(d.status, 401);
      assert.equal(
        d.text,
        '{"error": "identity_required", "message": "this request must identify itself (e.g. with an API key) to be served", "policy": "deny"}',
      );
      assert.equal((await send(port, "/deny", { headers: { "x-api-key": "k1" } })).status, 200);
      const skipped = l.counters.skipped;
      assert.deepEqual([(await send(port, "/skip")).status, (await send(port, "/skip")).status], [200, 200]);
      assert.equal(l.counters.skipped, skipped + 2);
      // Keyless requests count under the client IP, never "no limit"; a key of its own is apart.
      assert.deepEqual(
        [(await send(port, "/fallback")).status, (await send(port, "/fallback")).status],
        [200, 429],
      );
      assert.equal(
        (await send(port, "/fallback", { headers: { "x-api-key": "127.0.0.1" } })).status,
        200,
        "an API key equal to an IP is not that IP's bucket",
      );
      assert.equal(l.counters.missingDenied, 1);
    });

    test('no usable client address (a Unix socket): the one ip:unknown bucket, counted per request, warned once; "unix" trusts the socket\'s proxy', async () => {
      const l = await limiter("unix");
      const events: HttpEvent[] = [];
      const rule = { name: "u", limit: new GCRA({ burst: 2, rate: 2, periodMs: hour }), key: ipKey() };
      const plain = ex();
      plain.use(rateLimit(l, { rules: [rule], onEvent: (e) => events.push(e) }));
      const proxied = ex();
      proxied.use(rateLimit(l, { rules: [rule], clientIp: { trustedProxies: ["unix"] } }));
      const paths: string[] = [];
      for (const app of [plain, proxied]) {
        app.get("/", (_q, res) => res.send("ok"));
        const path = join(redis.dir, `http-${paths.length}.sock`);
        const s = createServer(app);
        await new Promise<void>((resolve) => s.listen(path, resolve));
        closers.push(() => close(s));
        paths.push(path);
      }
      const before = l.counters.peerUnknown;
      const statuses = [];
      for (let i = 0; i < 3; i++) statuses.push((await send(0, "/", { socketPath: paths[0]! })).status);
      assert.deepEqual(statuses, [200, 200, 429], "one shared bucket, never no limit");
      assert.equal(l.counters.peerUnknown, before + 3);
      assert.deepEqual(
        events.map((e) => e.type === "warning" && e.code),
        ["peer-unknown"],
      );
      const xff = (v: string) => ({ socketPath: paths[1]!, headers: { "x-forwarded-for": v } });
      assert.equal((await send(0, "/", xff("198.51.100.1"))).status, 200);
      assert.equal(
        (await send(0, "/", xff("198.51.100.2"))).status,
        200,
        "each client its own bucket behind the socket's proxy",
      );
      assert.equal(l.counters.peerUnknown, before + 3);
    });

    test("route-level middleware keys on express's route template", async () => {
      const l = await limiter("route key");
      const app = ex();
      const byRoute = rateLimit(l, {
        rules: [
          { name: "per-route", limit: new GCRA({ burst: 2, rate: 2, periodMs: hour }), key: routeKey() },
        ],
      });
      app.get("/users/:id", byRoute, (_q, res) => res.send("user"));
      const port = await serve(app);
      assert.deepEqual(
        [await send(port, "/users/1"), await send(port, "/users/2"), await send(port, "/users/3")].map(
          (r) => r.status,
        ),
        [200, 200, 429],
      );
    });
  });
}

describe("express middleware, Redis stopped mid-run", () => {
  let redis: Server;
  const closers: (() => Promise<void>)[] = [];
  before(async () => {
    redis = await new Server(true).start();
  });
  after(async () => {
    for (const c of closers.reverse()) await c();
    await redis.remove();
  });

  test("open admits without RateLimit fields; closed answers 503 without them; Redis decides again once back", async () => {
    const open = await limiterFor("ioredis", redis.port, {
      prefix: uniquePrefix("open"),
      timeoutMs: 300,
      probeIntervalMs: 50,
    });
    const closed = await limiterFor("ioredis", redis.port, {
      prefix: uniquePrefix("closed"),
      onError: "closed",
      timeoutMs: 300,
      probeIntervalMs: 50,
      closedRetryAfterMs: 2000,
    });
    closers.push(open.close, closed.close);
    const ports: number[] = [];
    for (const l of [open.limiter, closed.limiter]) {
      const app = express();
      app.use(
        rateLimit(l, {
          rules: [
            {
              name: "api",
              limits: [
                { name: "api", limit: new GCRA({ burst: 10, rate: 10, periodMs: hour }), key: ipKey() },
                { name: "slots", limit: new Lease({ limit: 5, leaseMs: 60_000 }), key: ipKey() },
              ],
            },
          ],
        }),
      );
      app.get("/", (_q, res) => res.send("ok"));
      const s = createServer(app);
      ports.push(await listen(s));
      closers.push(() => close(s));
    }
    const [po, pc] = ports as [number, number];
    assert.ok((await send(po, "/")).headers["ratelimit"]);
    assert.ok((await send(pc, "/")).headers["ratelimit"]);
    await redis.kill();
    for (let i = 0; i < 2; i++) {
      const r = await send(po, "/");
      assert.equal(r.status, 200);
      assert.equal(r.headers["ratelimit"], undefined);
      assert.equal(r.headers["ratelimit-policy"], undefined);
      const c = await send(pc, "/");
      assert.equal(c.status, 503);
      assert.equal(c.headers["ratelimit"], undefined);
      assert.equal(c.headers["ratelimit-policy"], undefined);
      assert.equal(c.headers["retry-after"], "2");
      assert.equal(
        c.text,
        '{"error": "limiter_unavailable", "message": "the rate limiter is unavailable; retry shortly", "retry_after": 2}',
      );
    }
    await redis.start();
    for (const p of [po, pc]) {
      assert.ok(
        await until(async () => {
          const r = await send(p, "/");
          return r.status === 200 && r.headers["ratelimit"] !== undefined;
        }),
      );
    }
    await sleep(1);
  });
});
