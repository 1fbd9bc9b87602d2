// A three-master Redis Cluster, with the module and without it (the fallback loaded on every
// master), through ioredis's Cluster and node-redis's createCluster: checks routed to each
// key's master, checkAll in one RL.ALL when the keys share a hash tag and slot group by slot
// group with refunds when they do not (docs/clients.md#identities-stay-apart), and leases.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { GCRA, Window, Lease, RateLimiter, RateLimitedError, RedisReplyError } from "../src/index.js";
import { LIBS, startCluster, clusterClientFor, rawCommand, type Server } from "./harness.js";
import { keySlot } from "../src/slots.js";

for (const module of [true, false]) {
  describe(`cluster (${module ? "module" : "fallback"})`, () => {
    let nodes: Server[] = [];
    before(async () => {
      nodes = await startCluster(module);
    });
    after(async () => {
      for (const n of nodes) await n.remove();
    });

    for (const lib of LIBS) {
      describe(lib, () => {
        let limiter: RateLimiter;
        let close: () => Promise<void>;
        before(async () => {
          const c = await clusterClientFor(lib, nodes);
          close = c.close;
          limiter = new RateLimiter({ client: c.client, prefix: `${lib}:` });
        });
        after(async () => close());

        test("checks go to each key's master, in the detected mode", async () => {
          assert.equal(limiter.isCluster, true);
          assert.equal(await limiter.resolvedMode(), module ? "module" : "fallback");
          const g = new GCRA({ burst: 2, rate: 1, periodMs: 60_000 });
          const keys = ["a", "b", "c", "d", "e", "f"];
          assert.ok(new Set(keys.map((k) => keySlot(`${lib}:${k}`))).size > 1);
          for (const k of keys) {
            assert.equal((await limiter.check(k, g)).remaining, 1);
            assert.equal((await limiter.check(k, g)).remaining, 0);
            const d = await limiter.check(k, g);
            assert.equal(d.allowed, false);
            assert.equal(d.source, module ? "module" : "fallback");
          }
          if (!module) {
            // The library was loaded on every master.
            for (const n of nodes)
              assert.match(await rawCommand(n.port, ["FCALL_RO", "rl_version", "0"]), /\d+\.\d+/);
          }
        });

        test("checkAll of one hash tag is one atomic RL.ALL", async () => {
          const a = new Window({ limit: 5, windowMs: 60_000 });
          const b = new GCRA({ burst: 1, rate: 1, periodMs: 60_000 });
          assert.equal((await limiter.checkAll({ "{u}:a": a, "{u}:b": b })).allowed, true);
          const d = await limiter.checkAll({ "{u}:a": a, "{u}:b": b });
          assert.equal(d.allowed, false);
          assert.equal((await limiter.check("{u}:a", a, { cost: 0 })).remaining, 4);
        });

        test("checkAll acrossSlots: group by group, earlier groups refunded when a later one denies", async () => {
          const perUser = new Window({ limit: 10, windowMs: 60_000 });
          const perIp = new GCRA({ burst: 1, rate: 1, periodMs: 60_000 });
          const lease = new Lease({ limit: 3, leaseMs: 60_000 });
          const entries = (token: string) =>
            new Map<string, Window | GCRA | { limit: Lease; token: string }>([
              ["{user:1}:rpm", perUser],
              ["{lease:1}:jobs", { limit: lease, token }],
              ["{ip:9}:rpm", perIp],
            ]);
          const slots = [...entries("t").keys()].map((k) => keySlot(`${lib}:${k}`));
          assert.equal(new Set(slots).size, 3);
          // Without acrossSlots: the server's CROSSSLOT error, nothing charged.
          await assert.rejects(limiter.checkAll(entries("t0")), (e: unknown) => {
            assert.ok(e instanceof RedisReplyError, String(e));
            assert.equal(e.replyCode, "CROSSSLOT");
            return true;
          });
          const first = await limiter.checkAll(entries("t1"), { acrossSlots: true });
          assert.equal(first.allowed, true);
          assert.equal(first.perKey!.length, 3);
          const denied = await limiter.checkAll(entries("t2"), { acrossSlots: true });
          assert.equal(denied.allowed, false);
          assert.ok(denied.retryAfterMs > 0);
          // The denial left no charge behind: the user's window and the lease are as after the first.
          assert.equal((await limiter.check("{user:1}:rpm", perUser, { cost: 0 })).remaining, 9);
          const held = await limiter.acquire("{lease:1}:jobs", lease, { slots: 2 });
          assert.equal(held.decision.remaining, 0); // t1 holds one, t2 was released, this holds two
          await held.release();
          assert.ok(limiter.counters.refunded >= 1);
        });

        test("acquire and renew a lease on a Cluster", async () => {
          const l = new Lease({ limit: 1, leaseMs: 1200 });
          const h = await limiter.acquire("{job}:x", l);
          await new Promise((r) => setTimeout(r, 1500)); // past the lease time: only the renewals keep it
          await assert.rejects(limiter.acquire("{job}:x", l), RateLimitedError);
          await h.release();
        });
      });
    }
  });
}
