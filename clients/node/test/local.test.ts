// The failure policy "local" with Redis stopped mid-run (docs/clients.md#failure-policy-local):
// each process enforces the same limits in memory, divided by the fleet size, with the
// local figures (degraded, not blind, source "local", RateLimit fields from them); RL.ALL's
// all or nothing, refunds and leases in memory too; the first call after Redis answers again
// is decided by Redis; and after recovery a charge memory took is given back to memory
// (refund, refundDecision, release). As clients/go/failure_policy_test.go's
// TestLocalEnforcesTheLimitsInMemoryThenReturnsToRedis and clients/go/local_refund_test.go.
import { describe, test, after } from "node:test";
import assert from "node:assert/strict";
import {
  GCRA,
  Window,
  Lease,
  RateLimitedError,
  RateLimitConfigError,
  decisionHeaders,
  parseLimits,
  type Decision,
  type Limit,
  type LimiterEvent,
  type RateLimiter,
} from "../src/index.js";
import { Redis } from "ioredis";
import { createClient } from "redis";
import { RateLimiter as Limiter, type RateLimiterOptions } from "../src/index.js";
import { Server, limiterFor, startCluster, clusterClientFor, type Lib } from "./harness.js";
import { keySlot } from "../src/slots.js";

/**
 * A limiter on a client whose offline queue is off: a call the limiter gave up on during the
 * outage (and charged in memory) must not reach Redis once it is back (README: that queue
 * only under-admits, but these tests count exactly).
 */
async function queueless(
  lib: Lib,
  port: number,
  options: Omit<RateLimiterOptions, "client" | "sendCommand">,
) {
  if (lib === "ioredis") {
    const c = new Redis({ port, host: "127.0.0.1", maxRetriesPerRequest: 1, enableOfflineQueue: false });
    c.on("error", () => {});
    await new Promise((resolve) => c.once("ready", resolve));
    return {
      client: c as unknown,
      limiter: new Limiter({ client: c, ...options }),
      close: async () => void c.disconnect(),
    };
  }
  const c = createClient({
    socket: { port, host: "127.0.0.1", reconnectStrategy: () => 50 },
    disableOfflineQueue: true,
  });
  c.on("error", () => {});
  await c.connect();
  return {
    client: c as unknown,
    limiter: new Limiter({ client: c, ...options }),
    close: async () => void c.destroy(),
  };
}

const show = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Checks key until Redis (not the policy) decides, within 10 s. */
async function decidedByRedis(limiter: RateLimiter, key: string, limit: GCRA | Window): Promise<Decision> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const d = await limiter.check(key, limit);
    if (!d.degraded) return d;
    if (Date.now() > deadline) throw new Error(`Redis did not decide within 10 s: ${show(d)}`);
    await sleep(20);
  }
}

/** Waits (10 s at most) until the client library is connected again. */
async function reconnected(client: unknown): Promise<void> {
  const c = client as { status?: string; isReady?: boolean };
  const deadline = Date.now() + 10_000;
  while (!(c.status === "ready" || c.isReady === true)) {
    if (Date.now() > deadline) throw new Error("the client did not reconnect within 10 s");
    await sleep(10);
  }
}

/** What the local policy's memory reports for key under limit (QUANTITY 0, a peek). */
function inMemory(limiter: RateLimiter, key: string, limit: Limit) {
  const [, spec] = limiter.local!.share(limit);
  return limiter.local!.memory.check(limiter.prefix + key, spec, 0n, true, false).map(Number);
}

/** What Redis reports for key (cost 0, not degraded). */
async function inRedis(limiter: RateLimiter, key: string, limit: GCRA | Window): Promise<Decision> {
  const d = await limiter.check(key, limit, { cost: 0 });
  assert.equal(d.degraded, false, `Redis did not report ${key}`);
  return d;
}

const modes: [Lib, boolean][] = [
  ["ioredis", true],
  ["node-redis", true],
  ["ioredis", false],
];

for (const [lib, module] of modes) {
  describe(`the local policy via ${lib} (${module ? "module" : "fallback"})`, () => {
    const servers: Server[] = [];
    after(async () => {
      for (const s of servers) await s.remove();
    });
    const setup = async (options: Omit<RateLimiterOptions, "client" | "sendCommand"> = {}) => {
      const s = await new Server(module).start();
      servers.push(s);
      const events: LimiterEvent[] = [];
      const l = await queueless(lib, s.port, {
        onError: "local",
        probeIntervalMs: 50,
        timeoutMs: 300,
        onEvent: (e) => events.push(e),
        ...options,
      });
      return { s, events, ...l };
    };
    const source = module ? "module" : "fallback";

    test("while Redis is down the limits are enforced in memory, divided by the fleet size; Redis decides again once it answers", async () => {
      const { s, limiter, close, events, client } = await setup({ fleetSize: 2 });
      const g = new GCRA({ burst: 6, rate: 2, periodMs: 60_000 }); // locally: burst 3, 1 per 60 s
      const w = new Window({ limit: 4, windowMs: 60_000, algorithm: "FIXED" }); // locally: 2
      const l = new Lease({ limit: 2, leaseMs: 60_000 }); // locally: 1
      try {
        assert.equal((await limiter.check("g", g)).degraded, false);
        await s.kill();
        const first = performance.now();
        const got: Decision[] = [];
        for (let i = 0; i < 4; i++) got.push(await limiter.check("g", g));
        const elapsed = performance.now() - first;
        const want = [
          [true, 3, 2],
          [true, 3, 1],
          [true, 3, 0],
          [false, 3, 0],
        ];
        got.forEach((d, i) => {
          assert.equal(d.degraded, true, `local ${i}`);
          assert.equal(d.blind, false);
          assert.equal(d.source, "local");
          assert.deepEqual([d.allowed, d.limit, d.remaining], want[i], `local ${i}: ${show(d)}`);
        });
        // 60 s from the first local charge, less the time these calls took.
        const denied = got[3]!;
        assert.ok(
          denied.retryAfterMs + elapsed + 1 >= 60_000 && denied.retryAfterMs <= 60_000,
          `retry after ${denied.retryAfterMs} (${elapsed} ms after the first)`,
        );
        const h = decisionHeaders(denied, { policyName: "g" });
        assert.equal(h["RateLimit-Policy"], '"g";q=3;w=180');
        assert.match(h["RateLimit"]!, /^"g";r=0;t=\d+$/);
        assert.ok(
          Number(h["Retry-After"]) <= 60 && Number(h["Retry-After"]) * 1000 + elapsed + 1000 >= 60_000,
        );
        // Several limits in memory: all or nothing, as RL.ALL.
        const both = { "{u}:g": g, "{u}:w": w };
        const all: Decision[] = [];
        for (let i = 0; i < 3; i++) all.push(await limiter.checkAll(both));
        assert.deepEqual(
          all.map((d) => d.allowed),
          [true, true, false],
        );
        assert.equal(all[2]!.degraded, true);
        assert.equal(all[2]!.source, "local");
        assert.equal(all[1]!.perKey![0]!.remaining, 1, "the GCRA was charged twice, not three times");
        assert.equal(all[2]!.perKey![0]!.remaining, 0, "as RL.ALL reports a key of a denied call");
        assert.equal(
          (await limiter.check("{u}:g", g, { cost: 0 })).remaining,
          1,
          "not charged by the denied call",
        );
        assert.equal(all[2]!.perKey![1]!.remaining, 0);
        // A refund during the outage goes back to memory.
        const r = await limiter.refund("g", 1);
        assert.equal(r.refunded, 1);
        assert.equal(r.degraded, true);
        const again = await limiter.check("g", g);
        assert.equal(again.allowed, true);
        assert.equal(again.source, "local");
        // A lease in memory: one slot locally; renewed and released there.
        const held = await limiter.acquire("job", l);
        assert.equal(held.decision.degraded, true);
        assert.equal(held.decision.blind, false);
        assert.equal(held.decision.source, "local");
        assert.equal(held.decision.limit, 1);
        await assert.rejects(
          limiter.acquire("job", l),
          (e: unknown) => e instanceof RateLimitedError && e.decision.source === "local",
        );
        const renewed = await held.renew();
        assert.equal(renewed.allowed, true);
        assert.equal(renewed.source, "local");
        const rel = await held.release();
        assert.equal(rel.refunded, 1);
        assert.equal(rel.degraded, true);
        const h2 = await limiter.acquire("job", l);
        assert.equal(h2.decision.source, "local");
        await h2.release();
        const c = limiter.counters;
        assert.ok(c.local >= 11 && c.degraded >= 11 && c.refunded >= 1, show(c));
        assert.ok(c.denied >= 2 && c.allowed >= 6, show(c));
        assert.equal(c.allowedLocally, 0);
        await s.start();
        await reconnected(client);
        await sleep(60); // past the probe interval: the next call tries Redis
        const back = await limiter.check("g", g);
        assert.equal(back.degraded, false, "the first call after recovery is decided by Redis");
        assert.equal(back.allowed, true);
        assert.equal(back.source, source);
        assert.equal(back.limit, 6, "Redis's limit, not the local share");
        assert.equal(events.filter((e) => e.type === "outage").length, 1);
        assert.equal(events.filter((e) => e.type === "recovered").length, 1);
      } finally {
        await close();
      }
    });

    test("in memory, exactly as the module: each algorithm admits its limit and no more, with its figures", async () => {
      const { s, limiter, close } = await setup();
      const limits: (GCRA | Window)[] = [
        new GCRA({ burst: 5, rate: 1, periodMs: 3_600_000 }),
        new Window({ limit: 5, windowMs: 3_600_000, algorithm: "FIXED" }),
        new Window({ limit: 5, windowMs: 3_600_000, algorithm: "SLIDING" }),
        new Window({ limit: 5, windowMs: 3_600_000, algorithm: "LOG" }),
      ];
      try {
        await decidedByRedis(limiter, "probe", limits[0]!);
        await s.kill();
        for (const [i, lim] of limits.entries()) {
          const got: Decision[] = [];
          for (let j = 0; j < 7; j++) got.push(await limiter.check(`ex${i}`, lim));
          assert.deepEqual(
            got.map((d) => [d.allowed, d.remaining, d.degraded, d.source]),
            [
              [true, 4, true, "local"],
              [true, 3, true, "local"],
              [true, 2, true, "local"],
              [true, 1, true, "local"],
              [true, 0, true, "local"],
              [false, 0, true, "local"],
              [false, 0, true, "local"],
            ],
            `${lim}`,
          );
          assert.ok(got[5]!.retryAfterMs > 0 && got[5]!.retryAfterMs <= 7_200_000, show(got[5]));
          const big = await limiter.check(`ex${i}`, lim, { cost: 6 });
          assert.equal(big.never, true, "more than the limit is never, as the module says");
          const peek = await limiter.check(`fresh${i}`, lim, { peek: true, cost: 3 });
          assert.equal(peek.allowed, true);
          assert.equal(
            (await limiter.check(`fresh${i}`, lim, { cost: 0 })).remaining,
            5,
            "a peek wrote nothing",
          );
        }
        // A limit string with several limits, in memory as in Redis: the tighter binds.
        const [perMinute, perHour] = parseLimits("2/minute; 3 per hour");
        const entries = { "{s}:m": perMinute!, "{s}:h": perHour! };
        const ds: Decision[] = [];
        for (let j = 0; j < 3; j++) ds.push(await limiter.checkAll(entries));
        assert.deepEqual(
          ds.map((d) => [d.allowed, d.limit, d.remaining]),
          [
            [true, 2, 1],
            [true, 2, 0],
            [false, 2, 0],
          ],
        );
        assert.equal(
          (await limiter.check("{s}:h", perHour!, { cost: 0 })).remaining,
          1,
          "the hour limit was not charged by the denied call",
        );
      } finally {
        await close();
      }
    });

    test("a limit string with several limits: checkAll decides the same in Redis and in memory", async () => {
      const { s, limiter, close } = await setup();
      const limits = parseLimits("3/hour; 5 per day, 4 per 2 hours", "FIXED");
      const run = async (tag: string) => {
        const entries = new Map(limits.map((l, i) => [`{${tag}}:${i}`, l] as const));
        const out: unknown[] = [];
        for (let i = 0; i < 5; i++) {
          const d = await limiter.checkAll(entries, { cost: i === 3 ? 2 : 1 });
          out.push([
            d.allowed,
            d.limit,
            d.remaining,
            d.degraded,
            ...d.perKey!.map((p) => [p.allowed, p.limit, p.remaining]),
          ]);
        }
        return out;
      };
      try {
        const redis = await run("r");
        await s.kill();
        const memory = await run("m");
        assert.deepEqual(
          memory.map((d) => (d as unknown[]).filter((_, i) => i !== 3)),
          redis.map((d) => (d as unknown[]).filter((_, i) => i !== 3)),
        );
        assert.deepEqual(
          redis.map((d) => (d as unknown[]).slice(0, 4)),
          [
            [true, 3, 2, false],
            [true, 3, 1, false],
            [true, 3, 0, false],
            [false, 3, 0, false],
            [false, 3, 0, false],
          ],
        );
        assert.ok(memory.every((d) => (d as unknown[])[3] === true));
      } finally {
        await close();
      }
    });

    test("a lease taken in memory is renewed there in the background while held", async () => {
      const { s, limiter, close } = await setup();
      const l = new Lease({ limit: 1, leaseMs: 600 });
      try {
        await decidedByRedis(limiter, "probe", new GCRA({ burst: 1, rate: 1, periodMs: 1000 }));
        await s.kill();
        const held = await limiter.acquire("bg", l);
        assert.equal(held.decision.source, "local");
        await sleep(1500); // 2.5 lease times: held only if renewed (every 200 ms)
        await assert.rejects(limiter.acquire("bg", l), RateLimitedError, "the lease lapsed in memory");
        assert.equal(held.lost, undefined);
        assert.equal((await held.release()).refunded, 1);
        await (await limiter.acquire("bg", l)).release();
      } finally {
        await close();
      }
    });

    test("a refund after recovery gives memory's charge back to memory, only the rest to Redis", async () => {
      const { s, limiter, close } = await setup();
      const g = new GCRA({ burst: 4, rate: 1, periodMs: 3_600_000 }); // nothing drains during the test
      try {
        await decidedByRedis(limiter, "probe", g);
        await s.kill();
        for (const [key, n] of [
          ["k", 2],
          ["split", 1],
        ] as const) {
          const d = await limiter.check(key, g, { cost: n });
          assert.ok(d.allowed && d.degraded && d.source === "local", show(d));
        }
        await s.start();
        await decidedByRedis(limiter, "probe", g);
        // Redis charges k once too: it holds 1 unit, memory 2.
        const d = await limiter.check("k", g);
        assert.ok(d.allowed && !d.degraded && d.remaining === 3, show(d));
        // Refunding the outage's 2 units gives them back in memory; Redis keeps its own.
        let r = await limiter.refund("k", 2);
        assert.equal(r.refunded, 2);
        assert.equal(r.degraded, true);
        assert.equal(r.remaining, 4, "memory's figures");
        assert.equal((await inRedis(limiter, "k", g)).remaining, 3, "Redis gave back a unit it did not take");
        assert.equal(inMemory(limiter, "k", g)[2], 4);
        // Nothing is owed in memory any more: the next refund is Redis's.
        r = await limiter.refund("k", 2);
        assert.deepEqual([r.refunded, r.degraded, r.remaining], [1, false, 4]);
        // More than memory owes: memory's part there, the rest to Redis.
        const sd = await limiter.check("split", g, { cost: 2 });
        assert.ok(sd.allowed && !sd.degraded);
        r = await limiter.refund("split", 3);
        assert.deepEqual([r.refunded, r.degraded], [3, false]);
        assert.equal((await inRedis(limiter, "split", g)).remaining, 4);
        assert.equal(inMemory(limiter, "split", g)[2], 4);
        assert.equal(limiter.counters.refunded, 6, "2 + 1 + 3");
      } finally {
        await close();
      }
    });

    test("refundDecision gives back where the decision took it; release after recovery frees memory's lease", async () => {
      const { s, limiter, close } = await setup();
      const g = new GCRA({ burst: 4, rate: 1, periodMs: 3_600_000 });
      const l = new Lease({ limit: 1, leaseMs: 60_000 });
      try {
        await decidedByRedis(limiter, "probe", g);
        await s.kill();
        const outage = await limiter.check("d", g, { cost: 2 });
        assert.ok(outage.allowed && outage.degraded && outage.source === "local");
        const held = await limiter.acquire("job", l);
        assert.ok(held.decision.degraded && held.decision.source === "local");
        await s.start();
        await decidedByRedis(limiter, "probe", g);
        const redis = await limiter.check("d", g);
        assert.equal(redis.degraded, false);
        // Redis's decision: Redis gives back, memory keeps what it owes.
        let r = await limiter.refundDecision(redis, 1);
        assert.deepEqual([r.refunded, r.degraded], [1, false]);
        assert.equal(inMemory(limiter, "d", g)[2], 2, "memory gave back a charge Redis took");
        // The outage's decision: memory gives back, after recovery; Redis is not asked.
        const calls = limiter.counters.redisCalls;
        r = await limiter.refundDecision(outage, 2);
        assert.deepEqual([r.refunded, r.degraded, r.remaining], [2, true, 4]);
        assert.equal(limiter.counters.redisCalls, calls, "a refund of memory's charge called Redis");
        assert.equal(inMemory(limiter, "d", g)[2], 4);
        for (const bad of [await limiter.checkAll({ a: g }), held.decision, { ...redis, key: "" }]) {
          await assert.rejects(
            limiter.refundDecision(bad as Decision, 1),
            (e: unknown) => e instanceof RateLimitConfigError && e.code === "ERR_RL_USAGE",
          );
        }
        await assert.rejects(limiter.refundDecision(redis, 0), RateLimitConfigError);
        // The lease memory granted, released by its token after recovery: freed in memory.
        const rel = await limiter.release("job", held.token);
        assert.deepEqual([rel.refunded, rel.degraded], [1, false]);
        const [, spec] = limiter.local!.share(l);
        const another = limiter.local!.memory.lease(limiter.prefix + "job", spec, "another", 1n, true, false);
        assert.equal(another[0], 1n, "memory still holds the released lease");
        // The handle knows its slot is gone; releasing it again is harmless.
        const again = await held.release();
        assert.equal(again.refunded, 0);
      } finally {
        await close();
      }
    });
  });
}

test("limits whose share rounds to zero are at least 1, and a share keeps the name", async () => {
  const s = await new Server(true).start();
  const { limiter, close } = await limiterFor("ioredis", s.port, {
    onError: "local",
    fleetSize: 10,
    timeoutMs: 300,
  });
  try {
    const g = new GCRA({ burst: 5, rate: 3, periodMs: 1000, name: "api" });
    const [shown, spec] = limiter.local!.share(g);
    assert.equal(spec.capacity, 1n);
    assert.ok(shown instanceof GCRA && shown.burst === 1n && shown.rate === 1n && shown.name === "api");
    assert.equal(spec.interval, 1_000_000_000n);
    const [w] = limiter.local!.share(new Window({ limit: 25, windowMs: 1000 }));
    assert.equal((w as Window).limit, 2n);
    await s.kill();
    const d = await limiter.check("x", g);
    assert.deepEqual([d.allowed, d.limit, d.degraded, d.spec?.name], [true, 1, true, "api"]);
    assert.equal((await limiter.check("x", g)).allowed, false);
  } finally {
    await close();
    await s.remove();
  }
});

test("on a Cluster, a checkAll across slots that memory denies gives the earlier group's charge back to memory", async () => {
  const nodes = await startCluster(true);
  const { client, close } = await clusterClientFor("ioredis", nodes);
  const limiter = new Limiter({ client, onError: "local", timeoutMs: 300, probeIntervalMs: 50 });
  const w = new Window({ limit: 1, windowMs: 3_600_000 });
  const a = "{x}:a";
  const b = "{y}:b";
  assert.notEqual(keySlot(a), keySlot(b));
  try {
    const up = await limiter.checkAll({ "{x}:probe": w, "{y}:probe": w }, { acrossSlots: true });
    assert.equal(up.degraded, false);
    for (const n of nodes) await n.kill();
    const used = await limiter.check(b, w); // b's one unit, taken in memory
    assert.deepEqual([used.allowed, used.source, used.degraded], [true, "local", true]);
    const d = await limiter.checkAll(
      [
        [a, w],
        [b, w],
      ],
      { acrossSlots: true },
    );
    assert.equal(d.allowed, false);
    assert.deepEqual(
      d.perKey!.map((p) => [p.allowed, p.source, p.degraded]),
      [
        [true, "local", true],
        [false, "local", true],
      ],
    );
    // a's group was charged in memory, then given back there (Redis never had it).
    assert.equal(inMemory(limiter, a, w)[2], 1, "the denied request left a charge behind in memory");
    assert.equal((await limiter.check(a, w)).allowed, true);
  } finally {
    await close();
    for (const n of nodes) await n.remove();
  }
});
