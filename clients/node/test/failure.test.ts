// The failure policy with Redis stopped and paused mid-run (docs/clients.md#failure-policy):
// open admits degraded, closed denies with a short retry, raise rejects; one event per
// outage; the first call after Redis answers again is decided by Redis.
import { describe, test, after } from "node:test";
import assert from "node:assert/strict";
import {
  GCRA,
  Window,
  Lease,
  RedisUnavailableError,
  RateLimitedError,
  type LimiterEvent,
} from "../src/index.js";
import { Server, LIBS, limiterFor } from "./harness.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const w = new Window({ limit: 100, windowMs: 60_000 });

for (const lib of LIBS) {
  describe(`failure policy via ${lib}`, () => {
    const servers: Server[] = [];
    after(async () => {
      for (const s of servers) await s.remove();
    });
    const server = async () => {
      const s = await new Server(true).start();
      servers.push(s);
      return s;
    };

    test("open admits degraded while Redis is down, and Redis decides again once it answers", async () => {
      const s = await server();
      const events: LimiterEvent[] = [];
      const { limiter, close } = await limiterFor(lib, s.port, {
        probeIntervalMs: 50,
        timeoutMs: 300,
        onEvent: (e) => events.push(e),
      });
      try {
        assert.equal((await limiter.check("k", w)).degraded, false);
        await s.kill();
        for (let i = 0; i < 3; i++) {
          const d = await limiter.check("k", w);
          assert.equal(d.allowed, true);
          assert.equal(d.degraded, true);
          assert.equal(d.blind, true);
          assert.equal(d.source, "local");
          assert.equal(d.limit, 100);
        }
        const r = await limiter.refund("k", 1);
        assert.equal(r.degraded, true);
        const c = limiter.counters;
        assert.ok(c.errors >= 1 && c.degraded >= 3, JSON.stringify(c));
        assert.equal(events.filter((e) => e.type === "outage").length, 1);
        await s.start();
        let d = await limiter.check("k", w);
        for (let i = 0; d.degraded && i < 100; i++) {
          await sleep(60);
          d = await limiter.check("k", w);
        }
        assert.equal(d.degraded, false);
        assert.equal(d.source, "module");
        assert.ok(events.some((e) => e.type === "recovered"));
      } finally {
        await close();
      }
    });

    test("closed denies with the short retry; raise rejects with RedisUnavailableError", async () => {
      const s = await server();
      const closed = await limiterFor(lib, s.port, {
        onError: "closed",
        closedRetryAfterMs: 1500,
        timeoutMs: 300,
      });
      const raise = await limiterFor(lib, s.port, { onError: "raise", timeoutMs: 300 });
      try {
        await closed.limiter.check("k", w);
        await raise.limiter.check("k", w);
        await s.kill();
        const d = await closed.limiter.check("k", w);
        assert.equal(d.allowed, false);
        assert.equal(d.degraded, true);
        assert.equal(d.never, false);
        assert.equal(d.retryAfterMs, 1500);
        await assert.rejects(
          closed.limiter.acquire("l", new Lease({ limit: 1, leaseMs: 1000 })),
          RateLimitedError,
        );
        await assert.rejects(raise.limiter.check("k", w), (e: unknown) => {
          assert.ok(e instanceof RedisUnavailableError, String(e));
          assert.equal(e.code, "ERR_RL_UNAVAILABLE");
          return true;
        });
        // Inside the probe interval: answered without trying Redis, still an error.
        await assert.rejects(raise.limiter.refund("k", 1), RedisUnavailableError);
      } finally {
        await closed.close();
        await raise.close();
      }
    });

    test("a lease whose renewals cannot reach Redis for a whole lease time is lost", async () => {
      const s = await server();
      const { limiter, close } = await limiterFor(lib, s.port, { timeoutMs: 100 });
      try {
        const h = await limiter.acquire("job", new Lease({ limit: 1, leaseMs: 400 }));
        const lost = new Promise<Error & { reason?: string }>((resolve) => h.once("lost", resolve));
        await s.kill();
        const e = await lost;
        assert.equal(e.reason, "unreachable");
        await assert.rejects(h.release(), (x: unknown) => x === e);
        assert.equal(limiter.counters.leasesLost, 1);
        assert.ok(limiter.counters.errors >= 1);
      } finally {
        await close();
      }
    });

    test("an acquire given up while its RL.LEASE is in flight releases the slot a generated token took", async () => {
      const s = await server();
      const { limiter, close } = await limiterFor(lib, s.port, { timeoutMs: 5000 });
      const l = new Lease({ limit: 1, leaseMs: 60_000 });
      try {
        await limiter.check("warm", w); // detection done: the next call is RL.LEASE itself
        s.pause();
        const reason = new Error("given up");
        const ac = new AbortController();
        const pending = limiter.acquire("inflight", l, { signal: ac.signal });
        const mine = limiter.acquire("inflight-own", l, { token: "mine", signal: ac.signal });
        await sleep(100); // both RL.LEASE sent, the server holds the replies back
        ac.abort(reason);
        await assert.rejects(pending, (e) => e === reason);
        await assert.rejects(mine, (e) => e === reason);
        s.resume();
        // The generated token's slot is released once the reply arrives; the caller's token stays held.
        let free = false;
        for (let i = 0; i < 50 && !free; i++) {
          await sleep(20);
          free = (await limiter.checkAll([["inflight", { limit: l, token: "probe" }]], { peek: true }))
            .allowed;
        }
        assert.equal(free, true);
        await assert.rejects(limiter.acquire("inflight-own", l), RateLimitedError);
        await limiter.release("inflight-own", "mine");
      } finally {
        s.resume();
        await close();
      }
    });

    test("a paused server costs no more than the timeout, and the policy answers", async () => {
      const s = await server();
      const { limiter, close } = await limiterFor(lib, s.port, { timeoutMs: 200 });
      try {
        await limiter.check("p", new GCRA({ burst: 5, rate: 5, periodMs: 1000 }));
        s.pause();
        const started = Date.now();
        const d = await limiter.check("p", new GCRA({ burst: 5, rate: 5, periodMs: 1000 }));
        const took = Date.now() - started;
        assert.equal(d.degraded, true);
        assert.ok(took < 1500, `took ${took} ms`);
        // An abort while the server does not answer rejects with the signal's reason.
        await sleep(1100); // past the probe interval: this call tries Redis
        const reason = new Error("caller gave up");
        const ac = new AbortController();
        setTimeout(() => ac.abort(reason), 50);
        await assert.rejects(
          limiter.check("p", new GCRA({ burst: 5, rate: 5, periodMs: 1000 }), { signal: ac.signal }),
          (e) => e === reason,
        );
        s.resume();
      } finally {
        s.resume();
        await close();
      }
    });
  });
}
