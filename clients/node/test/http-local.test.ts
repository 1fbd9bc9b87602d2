// The express middleware under the failure policy "local" (docs/clients.md#failure-policy-local):
// deductWhen gives each limit's charge back where its own decision took it — to Redis for a
// request Redis admitted, although the in-memory limiter still owes the key units it took for
// another request during the outage.
import { describe, test, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import express from "express";
import { Redis } from "ioredis";
import { GCRA, RateLimiter } from "../src/index.js";
import { rateLimit, ipKey } from "../src/http/express.js";
import { Server } from "./harness.js";
import { send, listen, close, sleep } from "./http-helpers.js";

for (const module of [true, false]) {
  describe(`express under "local" (${module ? "module" : "fallback"})`, () => {
    const closers: (() => Promise<void>)[] = [];
    after(async () => {
      for (const c of closers.reverse()) await c();
    });

    test("deductWhen after recovery refunds Redis's charge to Redis, not the outage's to memory", async () => {
      const s = await new Server(module).start();
      closers.push(() => s.remove());
      // No offline queue: a call given up during the outage must not reach Redis afterwards.
      const client = new Redis({
        port: s.port,
        host: "127.0.0.1",
        maxRetriesPerRequest: 1,
        enableOfflineQueue: false,
      });
      client.on("error", () => {});
      await new Promise((r) => client.once("ready", r));
      closers.push(async () => void client.disconnect());
      const limiter = new RateLimiter({
        client,
        onError: "local",
        probeIntervalMs: 50,
        timeoutMs: 300,
        denyCache: false,
      });
      const app = express();
      app.use(
        rateLimit(limiter, {
          rules: [
            {
              name: "ok-only",
              limit: new GCRA({ burst: 2, rate: 2, periodMs: 3_600_000 }), // nothing drains
              key: ipKey(),
              deductWhen: (status) => status < 500,
            },
          ],
        }),
      );
      app.get("/ok", (_q, res) => res.send("ok"));
      app.get("/fail", (_q, res) => res.status(500).send("failed"));
      const http = createServer(app);
      const port = await listen(http);
      closers.push(() => close(http));

      await s.kill();
      assert.equal((await send(port, "/ok")).status, 200, "admitted in memory during the outage");
      await s.restart();
      // Until Redis decides again (the probe interval lets one call through after it).
      const probe = new GCRA({ burst: 1000, rate: 1000, periodMs: 1000 });
      const deadline = Date.now() + 10_000;
      while ((await limiter.check("probe", probe)).degraded) {
        assert.ok(Date.now() < deadline, "Redis did not decide again within 10 s");
        await sleep(20);
      }
      // Redis admits and charges /fail; its 500 gives that unit back to Redis.
      assert.equal((await send(port, "/fail")).status, 500);
      const got = [];
      for (let i = 0; i < 3; i++) got.push((await send(port, "/ok")).status);
      assert.deepEqual(got, [200, 200, 429], "Redis's whole burst of 2 is there after the refund");
    });
  });
}
