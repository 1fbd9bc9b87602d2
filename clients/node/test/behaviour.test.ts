// The limiter against a real redis-server with the module (module mode) and without it (the
// Lua fallback), through ioredis (6 and 5) and node-redis (6, 5 and 4): the same replies either way.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import {
  GCRA,
  Window,
  Lease,
  RateLimiter,
  RateLimitConfigError,
  RateLimitedError,
  RedisReplyError,
  LeaseLostError,
  parseLimits,
  type LeaseHandle,
} from "../src/index.js";
import { Server, LIBS, OLDER_LIBS, limiterFor, uniquePrefix } from "./harness.js";

const servers: Record<"module" | "fallback", Server> = {
  module: new Server(true),
  fallback: new Server(false),
};
before(async () => {
  await servers.module.start();
  await servers.fallback.start();
});
after(async () => {
  await servers.module.remove();
  await servers.fallback.remove();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

for (const mode of ["module", "fallback"] as const) {
  for (const lib of [...LIBS, ...OLDER_LIBS] as const) {
    describe(`${mode} via ${lib}`, () => {
      let limiter: RateLimiter;
      let close: () => Promise<void>;
      before(async () => {
        ({ limiter, close } = await limiterFor(lib, servers[mode].port, {
          prefix: uniquePrefix(`${mode}.${lib}`),
        }));
      });
      after(async () => close());

      test("auto detects the mode and every decision says its source", async () => {
        assert.equal(await limiter.resolvedMode(), mode);
        const d = await limiter.check("src", new GCRA({ burst: 1, rate: 1, periodMs: 1000 }));
        assert.equal(d.source, mode);
        assert.equal(d.degraded, false);
      });

      test("an idle GCRA key admits exactly burst, then denies with an honest retry", async () => {
        const g = new GCRA({ burst: 3, rate: 1, periodMs: 60_000 });
        for (let i = 0; i < 3; i++) {
          const d = await limiter.check("gcra", g);
          assert.equal(d.allowed, true);
          assert.equal(d.limit, 3);
          assert.equal(d.remaining, 2 - i);
          assert.equal(d.retryAfterMs, 0);
          assert.equal(d.never, false);
        }
        const denied = await limiter.check("gcra", g);
        assert.equal(denied.allowed, false);
        assert.equal(denied.never, false);
        assert.ok(denied.retryAfterMs >= 1 && denied.retryAfterMs <= 60_000, String(denied.retryAfterMs));
        assert.ok(denied.resetAfterMs > 120_000);
        const c = limiter.counters;
        assert.ok(c.allowed >= 3 && c.denied >= 1 && c.redisCalls >= 4);
      });

      test("a cost above the limit is never allowed: never, retryAfterMs Infinity", async () => {
        const w = new Window({ limit: 5, windowMs: 60_000, algorithm: "FIXED" });
        const d = await limiter.check("never", w, { cost: 6 });
        assert.equal(d.allowed, false);
        assert.equal(d.never, true);
        assert.equal(d.retryAfterMs, Infinity);
        const ok = await limiter.check("never", w, { cost: 5 });
        assert.equal(ok.allowed, true);
        assert.equal(ok.remaining, 0);
      });

      test("peek writes nothing and cost 0 only reports", async () => {
        const w = new Window({ limit: 2, windowMs: 60_000 });
        assert.equal((await limiter.check("peek", w, { peek: true })).remaining, 1);
        assert.equal((await limiter.check("peek", w, { cost: 0 })).remaining, 2);
        assert.equal((await limiter.check("peek", w)).remaining, 1);
      });

      test("limit strings check as their windows", async () => {
        const [perSecond] = parseLimits("2/minute");
        assert.equal((await limiter.check("strings", perSecond!)).allowed, true);
        assert.equal((await limiter.check("strings", perSecond!)).allowed, true);
        assert.equal((await limiter.check("strings", perSecond!)).allowed, false);
      });

      test("maxWaitMs makes a reservation: admitted now, with the wait before acting", async () => {
        const g = new GCRA({ burst: 1, rate: 1, periodMs: 60_000 });
        assert.equal((await limiter.check("wait", g)).allowed, true);
        assert.equal((await limiter.check("wait", g, { maxWaitMs: 1000 })).allowed, false);
        const d = await limiter.check("wait", g, { maxWaitMs: 120_000 });
        assert.equal(d.allowed, true);
        assert.ok(d.retryAfterMs > 0 && d.retryAfterMs <= 60_000, String(d.retryAfterMs));
        await assert.rejects(
          limiter.check("wait", new Window({ limit: 1, windowMs: 1000 }), { maxWaitMs: 5 }),
          (e: unknown) => e instanceof RateLimitConfigError && e.code === "ERR_RL_USAGE",
        );
      });

      test("options the module refuses are refused before any call, in every mode", async () => {
        const g = new GCRA({ burst: 1, rate: 1, periodMs: 60_000 });
        const log = new Window({ limit: 5, windowMs: 1000, algorithm: "LOG" });
        const lease = new Lease({ limit: 1, leaseMs: 1000 });
        const calls = limiter.counters.redisCalls;
        const cases: [() => Promise<unknown>, RegExp][] = [
          [() => limiter.check("o", g, { maxWaitMs: 0.5 }), /^maxWaitMs must be a whole/],
          [() => limiter.check("o", g, { maxWaitMs: 1e20 }), /^maxWaitMs must be a whole/],
          [() => limiter.check("o", g, { maxWaitMs: -1 }), /^maxWaitMs must be a whole/],
          [() => limiter.check("o", g, { peek: true, force: true }), /^FORCE cannot be used with PEEK/],
          [() => limiter.check("o", g, { maxWaitMs: 5, force: true }), /^FORCE cannot be used with MAXWAIT/],
          [() => limiter.check("o", log, { force: true }), /^FORCE cannot be used with LOG/],
          [() => limiter.checkAll({ a: g, b: log }, { force: true }), /^FORCE cannot be used with LOG/],
          [
            () => limiter.checkAll({ a: g, b: { limit: lease, token: "t" } }, { force: true }),
            /^FORCE cannot be used on a LEASE limit/,
          ],
          [() => limiter.check("o", g, { cost: 2 ** 60 }), /^cost must be a safe integer/],
        ];
        for (const [f, message] of cases) {
          await assert.rejects(f, (e: unknown) => {
            assert.ok(e instanceof RateLimitConfigError, String(e));
            assert.match(e.message, message);
            return true;
          });
        }
        assert.equal(limiter.counters.redisCalls, calls);
        // The largest whole wait is sent as digits.
        assert.equal((await limiter.check("o", g, { maxWaitMs: Number.MAX_SAFE_INTEGER })).allowed, true);
      });

      test("checkAll is atomic and reports each key", async () => {
        const rpm = new Window({ limit: 10, windowMs: 60_000 });
        const tight = new GCRA({ burst: 1, rate: 1, periodMs: 60_000 });
        const first = await limiter.checkAll({ "{u1}:rpm": rpm, "{u1}:tight": tight });
        assert.equal(first.allowed, true);
        assert.equal(first.perKey!.length, 2);
        assert.equal(first.remaining, 0);
        assert.equal(first.spec, tight);
        const second = await limiter.checkAll(
          new Map<string, Window | GCRA>([
            ["{u1}:rpm", rpm],
            ["{u1}:tight", tight],
          ]),
        );
        assert.equal(second.allowed, false);
        assert.ok(second.retryAfterMs > 0);
        // Each per-key reply of a denial is what that limit alone answers without consuming
        // (docs/reference.md#r-all-2), and the denial charged nothing: rpm still has 9.
        assert.equal(second.perKey![0]!.remaining, 8);
        assert.equal((await limiter.check("{u1}:rpm", rpm, { cost: 0 })).remaining, 9);
      });

      test("checkAll with per-entry costs binds on the scarcest", async () => {
        const requests = new Window({ limit: 100, windowMs: 60_000 });
        const tokens = new Window({ limit: 1000, windowMs: 60_000 });
        const d = await limiter.checkAll([
          ["{u2}:req", requests],
          ["{u2}:tok", { limit: tokens, cost: 600 }],
        ]);
        assert.equal(d.allowed, true);
        assert.equal(d.spec, tokens);
        assert.equal(d.remaining, 400);
        const no = await limiter.checkAll([
          ["{u2}:req", requests],
          ["{u2}:tok", { limit: tokens, cost: 600 }],
        ]);
        assert.equal(no.allowed, false);
      });

      test("the local deny cache denies without a round trip, with the time left, until a refund", async () => {
        const g = new GCRA({ burst: 2, rate: 1, periodMs: 60_000 });
        await limiter.check("deny", g, { cost: 2 });
        const redis = await limiter.check("deny", g);
        assert.equal(redis.source, mode);
        assert.equal(redis.allowed, false);
        const calls = limiter.counters.redisCalls;
        const before = limiter.counters.deniedLocally;
        await sleep(20);
        const local = await limiter.check("deny", g);
        assert.equal(local.allowed, false);
        assert.equal(local.source, "local");
        assert.equal(local.degraded, false);
        assert.ok(
          local.retryAfterMs >= 1 && local.retryAfterMs < redis.retryAfterMs,
          `${local.retryAfterMs}`,
        );
        assert.equal(limiter.counters.redisCalls, calls);
        assert.equal(limiter.counters.deniedLocally, before + 1);
        // Another limit on the key, a peek, and a cost the limit can never hold go to Redis.
        assert.equal((await limiter.check("deny", g, { peek: true })).source, mode);
        assert.equal((await limiter.check("deny", g, { cost: 3 })).never, true);
        await limiter.refund("deny", 1);
        const after = await limiter.check("deny", g);
        assert.equal(after.source, mode);
        assert.equal(after.allowed, true);
      });

      test("refund gives back what was taken", async () => {
        const w = new Window({ limit: 3, windowMs: 60_000 });
        await limiter.check("refund", w, { cost: 3 });
        const r = await limiter.refund("refund", 2);
        assert.equal(r.refunded, 2);
        assert.equal(r.remaining, 2);
        assert.equal(r.degraded, false);
        assert.equal((await limiter.refund("refund-missing", 1)).refunded, 0);
        assert.ok(limiter.counters.refunded >= 2);
      });

      test("an error reply that is not an outage rejects as RedisReplyError", async () => {
        const w = new Window({ limit: 3, windowMs: 60_000, algorithm: "FIXED" });
        await limiter.check("mixed", w);
        await assert.rejects(
          limiter.check("mixed", new GCRA({ burst: 1, rate: 1, periodMs: 1000 })),
          (e: unknown) => {
            assert.ok(e instanceof RedisReplyError, String(e));
            assert.match(e.reply, /^ERR key '.*mixed' holds a FIXED window, not a GCRA limiter/);
            return true;
          },
        );
      });

      test("an aborted signal rejects with its reason, before any call", async () => {
        const ac = new AbortController();
        ac.abort();
        const calls = limiter.counters.redisCalls;
        await assert.rejects(
          limiter.check("abort", new Window({ limit: 1, windowMs: 1000 }), { signal: ac.signal }),
          {
            name: "AbortError",
          },
        );
        const reason = new Error("gone");
        await assert.rejects(
          limiter.checkAll(
            { a: new Window({ limit: 1, windowMs: 1000 }) },
            { signal: AbortSignal.abort(reason) },
          ),
          (e) => e === reason,
        );
        assert.equal(limiter.counters.redisCalls, calls);
      });

      test("unknown call options are refused", async () => {
        await assert.rejects(
          limiter.check("k", new Window({ limit: 1, windowMs: 1000 }), { costs: 2 } as never),
          (e: unknown) => e instanceof RateLimitConfigError && e.code === "ERR_RL_UNKNOWN_OPTION",
        );
        await assert.rejects(
          limiter.check("k", new Lease({ limit: 1, leaseMs: 1000 }) as never),
          (e: unknown) => e instanceof RateLimitConfigError && e.code === "ERR_RL_USAGE",
        );
      });

      test("acquire holds a slot, renews in the background, and releases", async () => {
        const l = new Lease({ limit: 1, leaseMs: 1200 });
        const a = await limiter.acquire("lease", l, { token: "holder-a" });
        assert.equal(a.decision.allowed, true);
        await assert.rejects(limiter.acquire("lease", l), (e: unknown) => e instanceof RateLimitedError);
        await sleep(2600); // more than two lease times: only the renewals keep it
        await assert.rejects(limiter.acquire("lease", l), (e: unknown) => e instanceof RateLimitedError);
        const r = await a.release();
        assert.equal(r.refunded, 1);
        assert.equal(a.lost, undefined);
        // Harmless twice: the second answers as the first did, without a call.
        const calls = limiter.counters.redisCalls;
        assert.deepEqual(await a.release(), r);
        assert.equal(limiter.counters.redisCalls, calls);
        const b = await limiter.acquire("lease", l);
        await b.release();
      });

      test("await using releases at the end of the block", async () => {
        const l = new Lease({ limit: 1, leaseMs: 10_000 });
        {
          await using held = await limiter.acquire("using", l);
          assert.equal(held.decision.remaining, 0);
        }
        const again = await limiter.acquire("using", l);
        await again.release();
      });

      test("a lease lost while held emits lost and release rejects with it", async () => {
        const l = new Lease({ limit: 1, leaseMs: 150 });
        const h: LeaseHandle = await limiter.acquire("lost", l);
        const lost = new Promise<LeaseLostError>((resolve) => h.once("lost", resolve));
        // Another holder's release frees nothing; deleting the key loses it for the renewal.
        await servers[mode].do("DEL", h.key);
        const e = await lost;
        assert.equal(e.reason, "not-held");
        await assert.rejects(h.release(), (x: unknown) => x === e);
        assert.ok(limiter.counters.leasesLost >= 1);
      });
    });
  }
}
