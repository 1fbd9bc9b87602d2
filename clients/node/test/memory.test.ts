// The in-memory algorithms (src/memory.ts) against the module, as clients/go/memory_test.go
// tests memory.go: random sequences on both sides at the same instants (the server's clock
// frozen by the repository's clock shim, tests/support/clock_shim.c), every reply equal
// field for field (checks with QUANTITY, PEEK, FORCE and MAXWAIT, refunds, RL.ALL, leases,
// releases, and the error replies); and the pure properties (a reported wait admits, 1 ms
// less does not; no window admits more than its limit; a GCRA past 64-bit time is the
// module's overflow error).
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Redis } from "ioredis";
import { GCRA, Window, Lease, type Limit } from "../src/index.js";
import { MemoryStore, memSpec, type Five, type MemSpec } from "../src/memory.js";
import { FrozenClock, Server } from "./harness.js";

/** A small deterministic generator (mulberry32). */
function rng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    float: next,
    int: (n: number) => Math.floor(next() * n),
    pick: <T>(xs: readonly T[]) => xs[Math.floor(next() * xs.length)]!,
  };
}

const H = 3_600_000;

/** The module's reply, or its error text. */
async function theirs(r: Redis, args: string[]): Promise<bigint[] | bigint[][] | string> {
  try {
    const v = (await r.call(args[0]!, ...args.slice(1))) as unknown;
    const conv = (x: unknown): bigint | bigint[] =>
      Array.isArray(x) ? x.map((y) => BigInt(y as number)) : BigInt(x as number);
    if (Array.isArray(v) && Array.isArray(v[0]))
      return [conv(v[0]) as bigint[], ...(v[1] as unknown[]).map((e) => conv(e) as bigint[])];
    return (v as unknown[]).map((x) => conv(x) as bigint);
  } catch (e) {
    return (e as Error).message;
  }
}

function ours(f: () => bigint[] | [Five, Five[]]): bigint[] | bigint[][] | string {
  try {
    const v = f();
    if (Array.isArray(v[0])) {
      const [c, each] = v as [Five, Five[]];
      return [c, ...each];
    }
    return v as bigint[];
  } catch (e) {
    return (e as Error).message;
  }
}

const show = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x));

describe("the in-memory limiter answers as the module does, at the same instants", () => {
  let dir: string;
  let clock: FrozenClock;
  let server: Server;
  let redis: Redis;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "redisrl-clock-"));
    clock = new FrozenClock(dir);
    server = await new Server(true, [], clock.env).start();
    redis = new Redis({ port: server.port, host: "127.0.0.1", maxRetriesPerRequest: 1 });
    redis.on("error", () => {});
  });
  after(async () => {
    redis.disconnect();
    await server.remove();
    clock.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("the clock shim governs the server", async () => {
    const probe = 1_700_000_000_123_456_000n;
    clock.freezeAt(probe);
    const [s, us] = (await redis.call("TIME")) as string[];
    assert.equal(BigInt(s!) * 1_000_000n + BigInt(us!), probe / 1000n);
  });

  test("random checks, refunds, RL.ALL, leases and releases: every reply equal", async () => {
    let now = ((BigInt(Date.now()) * 1_000_000n) / 1000n) * 1000n;
    const store = new MemoryStore(100_000, () => now);
    const r = rng(23);
    const groups: Limit[][] = [
      [
        new GCRA({ burst: 5, rate: 1, periodMs: H }),
        new GCRA({ burst: 8, rate: 2, periodMs: H }),
        new GCRA({ burst: 3, rate: 1, periodMs: 2 * H }),
        new GCRA({ burst: 4, rate: 3, periodMs: 1000 }),
      ],
      [
        new Window({ limit: 6, windowMs: H, algorithm: "FIXED" }),
        new Window({ limit: 4, windowMs: H, algorithm: "FIXED" }),
      ],
      [
        new Window({ limit: 6, windowMs: H }),
        new Window({ limit: 9, windowMs: H }),
        new Window({ limit: 3, windowMs: 1500 }),
      ],
      [
        new Window({ limit: 5, windowMs: H, algorithm: "LOG" }),
        new Window({ limit: 3, windowMs: H, algorithm: "LOG" }),
      ],
    ];
    const leases = [new Lease({ limit: 2, leaseMs: H }), new Lease({ limit: 3, leaseMs: 2000 })];
    const stepsUs = [
      0n,
      1n,
      999n,
      1_000n,
      250_000n,
      1_500_000n,
      60_000_000n,
      450_000_000n,
      1_800_000_000n,
      3_600_000_000n,
    ];
    const quantities = [0n, 1n, 1n, 1n, 2n, 3n, 7n];
    const prefix = `diff${Date.now()}:`;
    let compared = 0;
    const same = (what: string, a: unknown, b: unknown) => {
      assert.equal(show(a), show(b), `${what}: ours ${show(a)}, the module's ${show(b)}`);
      compared++;
    };
    for (let round = 0; round < 60; round++) {
      const kind = r.int(5);
      for (let step = 0; step < 12; step++) {
        if (r.float() < 0.4) now += r.pick(stepsUs) * 1000n;
        clock.freezeAt(now);
        if (kind === 4) {
          // leases: take, renew, release
          const key = `${prefix}lease${round % 3}`;
          const l = r.pick(leases);
          const spec = memSpec(l);
          const token = `t${r.int(4)}`;
          const op = r.float();
          if (op < 0.25) {
            same(
              `RL.RELEASE ${key} ${token}`,
              ours(() => store.release(key, token)),
              await theirs(redis, ["RL.RELEASE", key, token]),
            );
            continue;
          }
          const slots = BigInt(1 + r.int(2));
          const renew = op > 0.75;
          const args = ["RL.LEASE", key, ...l.args(), token, "QUANTITY", slots.toString()];
          if (renew) args.push("RENEW");
          same(
            args.join(" "),
            ours(() => store.lease(key, spec, token, slots, false, renew)),
            await theirs(redis, args),
          );
          continue;
        }
        const key = `${prefix}k${round % 6}:${kind}`;
        const lim = r.pick(groups[kind]!) as GCRA | Window;
        const spec = memSpec(lim);
        const n = r.pick(quantities);
        const peek = r.float() < 0.2;
        const force = !peek && r.float() < 0.1;
        const wait =
          lim instanceof GCRA && !force && r.float() < 0.2 ? r.pick([0, 1, 1000, 30_000, H]) : undefined;
        const args = [
          lim instanceof GCRA ? "RL.GCRA" : "RL.WINDOW",
          key,
          ...lim.args(),
          "QUANTITY",
          n.toString(),
        ];
        if (peek) args.push("PEEK");
        if (force) args.push("FORCE");
        if (wait !== undefined) args.push("MAXWAIT", String(wait));
        same(
          args.join(" "),
          ours(() => store.check(key, spec, n, peek, force, wait)),
          await theirs(redis, args),
        );
        if (r.float() < 0.15) {
          const q = BigInt(1 + r.int(3));
          same(
            `RL.REFUND ${key} ${q}`,
            ours(() => store.refund(key, q)),
            await theirs(redis, ["RL.REFUND", key, q.toString()]),
          );
        }
        if (r.float() < 0.2) {
          // RL.ALL over keys of their own (one of each kind), all or nothing
          const tag = `${prefix}{all${round % 2}}`;
          const items: { key: string; limit: Limit; spec: MemSpec; cost?: bigint; token?: string }[] = [];
          for (const g of groups) {
            if (r.float() < 0.6) {
              const l = g[0]!;
              items.push({ key: `${tag}:${memSpec(l).kind}`, limit: l, spec: memSpec(l) });
            }
          }
          if (r.float() < 0.4) {
            const l = leases[0]!;
            items.push({ key: `${tag}:E`, limit: l, spec: memSpec(l), token: `a${r.int(3)}`, cost: 1n });
          }
          if (items.length === 0) continue;
          for (const it of items) if (it.token === undefined && r.float() < 0.3) it.cost = BigInt(r.int(3));
          const q = r.pick([0n, 1n, 1n, 2n]);
          const allArgs = ["RL.ALL", String(items.length), ...items.map((i) => i.key)];
          for (const it of items) {
            allArgs.push(it.limit.head(), ...it.limit.args());
            if (it.token !== undefined) allArgs.push(it.token);
            if (it.cost !== undefined) allArgs.push("COST", it.cost.toString());
          }
          allArgs.push("QUANTITY", q.toString());
          same(
            allArgs.join(" "),
            ours(() =>
              store.checkAll(
                items.map((i) => ({ key: i.key, spec: i.spec, cost: i.cost, token: i.token })),
                q,
                false,
                false,
              ),
            ),
            await theirs(redis, allArgs),
          );
        }
      }
    }
    assert.ok(compared >= 700, `only ${compared} replies compared`);
  });

  test("the module's errors: FORCE on LOG, RENEW of a lease not held, a GCRA past 64-bit time", async () => {
    const now = ((BigInt(Date.now()) * 1_000_000n) / 1000n) * 1000n;
    clock.freezeAt(now);
    const store = new MemoryStore(100, () => now);
    const log = new Window({ limit: 3, windowMs: 1000, algorithm: "LOG" });
    const cases: [string[], () => bigint[]][] = [
      [
        ["RL.WINDOW", "e:log", ...log.args(), "FORCE"],
        () => store.check("e:log", memSpec(log), 1n, false, true),
      ],
      [
        ["RL.LEASE", "e:lease", "2", "60", "gone", "RENEW"],
        () =>
          store.lease("e:lease", memSpec(new Lease({ limit: 2, leaseMs: 60_000 })), "gone", 1n, false, true),
      ],
    ];
    // 58 · T fits in 64 bits (the limit is valid), but now + 58 · T does not.
    const far = new GCRA({ burst: 58, rate: 1, periodMs: 315_360_000_000 });
    cases.push([
      ["RL.GCRA", "e:far", ...far.args(), "QUANTITY", "58"],
      () => store.check("e:far", memSpec(far), 58n, false, false),
    ]);
    cases.push([
      ["RL.GCRA", "e:far2", ...far.args(), "QUANTITY", "58", "FORCE"],
      () => store.check("e:far2", memSpec(far), 58n, false, true),
    ]);
    for (const [args, f] of cases) {
      const t = await theirs(redis, args);
      assert.equal(typeof t, "string", `${args.join(" ")}: the module answered ${show(t)}`);
      assert.equal(ours(f), t, args.join(" "));
    }
  });
});

describe("the in-memory limiter's own properties", () => {
  const S = 1_000_000_000n;
  test("waiting exactly the reported time admits the same request, 1 ms less does not", () => {
    const r = rng(7);
    for (let i = 0; i < 300; i++) {
      const limit = 1 + r.int(5);
      const windowMs = (1 + r.int(4)) * 1000;
      const lim = r.pick([
        new GCRA({ burst: limit, rate: 3, periodMs: (1 + r.int(2)) * 1000 }),
        new Window({ limit, windowMs, algorithm: "FIXED" }),
        new Window({ limit, windowMs, algorithm: "SLIDING" }),
        new Window({ limit, windowMs, algorithm: "LOG" }),
      ]);
      const spec = memSpec(lim);
      let now = 10n ** 18n + BigInt(r.int(1e9)) * S;
      const store = new MemoryStore(10, () => now);
      for (let j = 0; j < 1 + r.int(11); j++) {
        const n = BigInt(1 + r.int(limit));
        const d = store.check("k", spec, n, true, false);
        if (d[0] === 1n) {
          store.check("k", spec, n, false, false);
          now += BigInt(r.int(3)) * (S / 4n);
          continue;
        }
        // The exact wait in ns is not in the reply (ms, rounded up): find it by the store's
        // own answer, then check the ms figure bounds it.
        const retryMs = d[3];
        const at = now;
        now = at + retryMs * 1_000_000n;
        assert.equal(
          store.check("k", spec, n, true, false)[0],
          1n,
          `${lim} n=${n}: not admitted after ${retryMs} ms`,
        );
        now = at + (retryMs - 1n) * 1_000_000n;
        if (retryMs > 1n)
          assert.equal(
            store.check("k", spec, n, true, false)[0],
            0n,
            `${lim}: admitted 1 ms before the wait`,
          );
        now = at + retryMs * 1_000_000n;
        store.check("k", spec, n, false, false);
      }
    }
  });

  test("no window admits more than its limit, FIXED's within each window, SLIDING's and LOG's over any window", () => {
    const r = rng(11);
    for (const algorithm of ["FIXED", "SLIDING", "LOG"] as const) {
      const w = new Window({ limit: 7, windowMs: 1000, algorithm });
      const spec = memSpec(w);
      let now = 1_700_000_000n * S;
      const store = new MemoryStore(10, () => now);
      const admitted: bigint[] = [];
      for (let i = 0; i < 3000; i++) {
        now += BigInt(r.int(20_000_000));
        if (store.check("k", spec, 1n, false, false)[0] === 1n) admitted.push(now);
      }
      for (let i = 0; i < admitted.length; i++) {
        let j = i;
        const end = algorithm === "FIXED" ? (admitted[i]! / S + 1n) * S : admitted[i]! + S;
        while (j < admitted.length && admitted[j]! < end) j++;
        // SLIDING is an estimate: over any 1 s it admits at most 2 × limit, in a fixed window at most limit
        const bound = algorithm === "SLIDING" ? 14 : 7;
        assert.ok(j - i <= bound, `${algorithm}: ${j - i} admitted within a window from ${admitted[i]}`);
      }
      assert.ok(admitted.length > 100, `${algorithm}: only ${admitted.length} admitted`);
    }
  });

  test("bounded: the least recently written keys go first", () => {
    const now = 1_700_000_000n * S;
    const store = new MemoryStore(3, () => now);
    const spec = memSpec(new Window({ limit: 1, windowMs: 60_000, algorithm: "FIXED" }));
    for (const k of ["a", "b", "c", "d"]) store.check(k, spec, 1n, false, false);
    assert.equal(store.size, 3);
    assert.equal(store.check("a", spec, 1n, true, false)[0], 1n, "a was forgotten: admits again");
    assert.equal(store.check("d", spec, 1n, true, false)[0], 0n);
  });
});
