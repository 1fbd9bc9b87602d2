// Batching (docs/clients.md#batching-optional) against real servers, in both modes, as
// clients/go/batch_test.go: local admissions from units paid for in Redis, never more than
// the limit (two limiters on one key, exact counts), FIXED windows never exceeded, leftovers
// given back after the hold or on close(), what cannot batch is one call each, and held
// units still admitting while Redis is down (then the local policy's memory).
import { describe, test, after } from "node:test";
import assert from "node:assert/strict";
import { GCRA, Window, MAX_SECONDS, type Decision, type RateLimiter } from "../src/index.js";
import { Server, limiterFor } from "./harness.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const show = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x));

for (const module of [true, false]) {
  describe(`batching (${module ? "module" : "fallback"})`, () => {
    const servers: Server[] = [];
    const closers: (() => Promise<void>)[] = [];
    after(async () => {
      for (const c of closers) await c();
      for (const s of servers) await s.remove();
    });
    let shared: Server | undefined;
    const server = async () => {
      if (shared === undefined) {
        shared = await new Server(module).start();
        servers.push(shared);
      }
      return shared;
    };
    let n = 0;
    const limiter = async (options: Parameters<typeof limiterFor>[2] = {}, s?: Server) => {
      const srv = s ?? (await server());
      const l = await limiterFor("ioredis", srv.port, {
        prefix: `b${module ? "m" : "f"}${++n}:`,
        ...options,
      });
      closers.push(l.close);
      await l.limiter.resolvedMode();
      return l.limiter;
    };
    const source = module ? "module" : "fallback";

    test("admits locally from batches and never more than the limit", async () => {
      const l = await limiter({ batch: 5, batchHoldMs: 200 });
      const g = new GCRA({ burst: 20, rate: 20, periodMs: 1000 }); // 20 at once, then one per 50 ms
      const start = performance.now();
      let admitted = 0;
      for (let i = 0; i < 400; i++) if ((await l.check("b", g)).allowed) admitted++;
      const bound = 20 + Math.floor(((performance.now() - start) / 1000) * 20) + 1;
      assert.ok(admitted >= 20 && admitted <= bound, `admitted ${admitted}, want within [20, ${bound}]`);
      const c = l.counters;
      assert.ok(c.allowedLocally > 0 && c.redisCalls < admitted, show(c));
      assert.equal(c.allowed, admitted);
      await l.close();
    });

    test("leftovers go back after the hold", async () => {
      // One refund call per credit, and one past the timeout is lost (it only under-admits):
      // a timeout no busy CI machine reaches, as this is about the refund, not the timeout.
      const l = await limiter({ batch: 5, batchHoldMs: 100, timeoutMs: 10_000 });
      const g = new GCRA({ burst: 50, rate: 1, periodMs: 60_000 });
      const d = await l.check("lo", g);
      assert.ok(d.allowed && d.remaining === 49, `45 left in Redis + 4 held here: ${show(d)}`);
      assert.equal(d.source, source);
      assert.equal((await l.check("lo", g, { cost: 0 })).remaining, 45, "Redis after the batch");
      const local = await l.check("lo", g);
      assert.deepEqual(
        [local.allowed, local.source, local.degraded, local.remaining],
        [true, "local", false, 48],
      );
      const deadline = Date.now() + 20_000;
      while (Date.now() < deadline && l.counters.refunded < 3) await sleep(50);
      assert.equal(l.counters.refunded, 3, JSON.stringify(l.counters));
      assert.equal((await l.check("lo", g, { cost: 0 })).remaining, 48, "after the hold");
      assert.equal(l.counters.allowedLocally, 1);
    });

    test("near the limit a batch takes what is left", async () => {
      const l = await limiter({ batch: 10, batchHoldMs: 5000 });
      const g = new GCRA({ burst: 12, rate: 1, periodMs: 3_600_000 });
      const got: boolean[] = [];
      for (let i = 0; i < 14; i++) got.push((await l.check("n", g)).allowed);
      assert.deepEqual(got, [...Array(12).fill(true), false, false]);
      await l.close();
    });

    test("two limiters batching on one key never admit more than the limit; with what Redis has left, exactly the limit", async () => {
      const limits: [string, GCRA | Window][] = [
        ["gcra", new GCRA({ burst: 50, rate: 1, periodMs: 3_600_000 })],
        ["fixed", new Window({ limit: 50, windowMs: 3_600_000, algorithm: "FIXED" })],
        ["sliding", new Window({ limit: 50, windowMs: 3_600_000, algorithm: "SLIDING" })],
      ];
      const prefix = `two${module ? "m" : "f"}:`;
      const a = await limiter({ batch: 8, batchHoldMs: 1000, prefix });
      const b = await limiter({ batch: 8, batchHoldMs: 1000, prefix });
      for (const [name, lim] of limits) {
        let admitted = 0;
        const worker = async (l: RateLimiter) => {
          for (let i = 0; i < 20; i++) if ((await l.check(name, lim)).allowed) admitted++;
        };
        await Promise.all([a, b].flatMap((l) => Array.from({ length: 8 }, () => worker(l))));
        await a.close();
        await b.close();
        const left = (await a.check(name, lim, { cost: 0 })).remaining;
        assert.ok(admitted <= 50, `${name}: admitted ${admitted} > 50`);
        assert.equal(admitted + left, 50, `${name}: admitted ${admitted}, Redis has ${left} left`);
      }
      assert.ok(
        a.counters.allowedLocally + b.counters.allowedLocally > 0,
        "no local admission: not batching",
      );
    });

    test("a FIXED window never admits more than its limit in any window", async () => {
      const prefix = `fw${module ? "m" : "f"}:`;
      const a = await limiter({ batch: 4, batchHoldMs: 1000, prefix });
      const b = await limiter({ batch: 4, batchHoldMs: 1000, prefix });
      const w = new Window({ limit: 15, windowMs: 500, algorithm: "FIXED" });
      const perWindow = new Map<number, number>();
      const deadline = Date.now() + 2200;
      while (Date.now() < deadline) {
        for (const l of [a, b]) {
          const before = Math.floor(Date.now() / 500);
          const d = await l.check("fw", w);
          const afterW = Math.floor(Date.now() / 500);
          // The window the admission lands in (this host's clock; the server runs here too).
          if (d.allowed && before === afterW) perWindow.set(before, (perWindow.get(before) ?? 0) + 1);
        }
      }
      assert.ok(perWindow.size > 0, "nothing admitted");
      for (const [win, count] of perWindow) assert.ok(count <= 15, `window ${win} admitted ${count} > 15`);
      assert.ok(
        a.counters.allowedLocally + b.counters.allowedLocally > 0,
        "no local admission: not batching",
      );
    });

    test("a window's credit is never used in the next window", async () => {
      const l = await limiter({ batch: 5, batchHoldMs: 60_000 });
      const w = new Window({ limit: 10, windowMs: 300, algorithm: "FIXED" });
      const untilNext = () => sleep(300 - (Date.now() % 300) + 10);
      await untilNext();
      const first = await l.check("nw", w);
      assert.deepEqual([first.allowed, first.source], [true, source]);
      await untilNext();
      const next = await l.check("nw", w);
      assert.deepEqual(
        [next.allowed, next.source],
        [true, source],
        "the units held were paid in the last window",
      );
    });

    test("GCRA leftovers past their drain are not given back", async () => {
      const l = await limiter({ batch: 5, batchHoldMs: 60_000 });
      const g = new GCRA({ burst: 10, rate: 10, periodMs: 1000 }); // T = 100 ms: 5 units drain in 500 ms
      await l.check("dr", g);
      await sleep(600);
      const calls = l.counters.redisCalls;
      assert.equal(await l.close(), 0);
      assert.equal(
        l.counters.redisCalls,
        calls,
        "a refund after the bucket could have drained past the units",
      );
    });

    test("close() gives back what is held; without batching it does nothing", async () => {
      const l = await limiter({ batch: 5, batchHoldMs: 60_000 });
      const limits = [
        new GCRA({ burst: 10, rate: 1, periodMs: 3_600_000 }),
        new Window({ limit: 10, windowMs: 3_600_000 }),
        new Window({ limit: 10, windowMs: MAX_SECONDS * 1000, algorithm: "FIXED" }),
      ];
      for (const [i, lim] of limits.entries()) {
        const d = await l.check(`close${i}`, lim);
        assert.equal(d.remaining, 9, show(d));
        assert.equal((await l.check(`close${i}`, lim, { cost: 0 })).remaining, 5);
      }
      assert.equal(await l.close(), 12);
      for (const [i, lim] of limits.entries()) {
        assert.equal((await l.check(`close${i}`, lim, { cost: 0 })).remaining, 9, `${lim}`);
      }
      assert.equal(await (await limiter()).close(), 0);
    });

    test("what cannot batch is one call each: LOG, peek, force, a cost of k or more, checkAll", async () => {
      const l = await limiter({ batch: 5, batchHoldMs: 60_000 });
      const g = new GCRA({ burst: 50, rate: 1, periodMs: 3_600_000 });
      const log = new Window({ limit: 50, windowMs: 3_600_000, algorithm: "LOG" });
      const calls: [string, () => Promise<Decision>][] = [
        ["log", () => l.check("one:log", log)],
        ["peek", () => l.check("one:g", g, { peek: true })],
        ["force", () => l.check("one:g", g, { force: true })],
        ["cost 5", () => l.check("one:g", g, { cost: 5 })],
        ["checkAll", () => l.checkAll({ "one:g": g })],
      ];
      for (const [what, f] of calls) {
        for (let i = 0; i < 2; i++) {
          const before = l.counters.redisCalls;
          const d = await f();
          assert.equal(d.source, source, what);
          assert.equal(l.counters.redisCalls, before + 1, what);
        }
      }
      assert.equal(l.counters.allowedLocally, 0);
    });

    test("held units still admit while Redis is down; after them the local policy's memory; their refund is dropped", async () => {
      const s = await new Server(module).start();
      servers.push(s);
      const l = await limiter(
        { batch: 5, batchHoldMs: 60_000, onError: "local", timeoutMs: 300, probeIntervalMs: 50 },
        s,
      );
      const g = new GCRA({ burst: 50, rate: 1, periodMs: 3_600_000 });
      const d = await l.check("out", g);
      assert.deepEqual([d.allowed, d.degraded, d.source], [true, false, source]);
      await s.kill();
      for (let i = 0; i < 2; i++) {
        const h = await l.check("out", g);
        assert.deepEqual([h.allowed, h.degraded, h.source], [true, false, "local"], `held unit ${i}`);
      }
      // The 2 units still held cannot go back: dropped, not an error (it only under-admits).
      assert.equal(await l.close(), 0);
      const m = await l.check("out", g);
      assert.deepEqual(
        [m.allowed, m.degraded, m.source, m.remaining],
        [true, true, "local", 49],
        "memory, once no held unit is left",
      );
      const c = l.counters;
      assert.deepEqual([c.allowedLocally, c.local, c.degraded, c.allowed], [2, 1, 1, 4]);
      assert.ok(c.errors >= 1);
    });
  });
}
