// The HTTP core on a three-master Redis Cluster (module): a rule whose limits key different
// identities (their keys in different slots) is checked slot group by slot group, and a
// request a later group denies leaves no charge on the earlier (docs/clients.md#identities-stay-apart);
// with a rule hash tag all its keys are one RL.ALL in one slot.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import express from "express";
import { GCRA, RateLimiter } from "../src/index.js";
import { rateLimit, ipKey, headerKey, identityKey } from "../src/http/express.js";
import { keySlot } from "../src/slots.js";
import { startCluster, clusterClientFor, type Server } from "./harness.js";
import { send, listen, close } from "./http-helpers.js";

describe("HTTP on a Redis Cluster", () => {
  let nodes: Server[] = [];
  const closers: (() => Promise<void>)[] = [];
  before(async () => {
    nodes = await startCluster(true);
  });
  after(async () => {
    for (const c of closers.reverse()) await c();
    for (const n of nodes) await n.remove();
  });

  test("limits of different identities in different slots: a denial by one leaves no charge on the other", async () => {
    const c = await clusterClientFor("ioredis", nodes);
    closers.push(c.close);
    const limiter = new RateLimiter({ client: c.client, prefix: "http:" });
    const perIp = new GCRA({ burst: 100, rate: 100, periodMs: 3_600_000 });
    const perKey = new GCRA({ burst: 2, rate: 2, periodMs: 3_600_000 });
    const app = express();
    app.use(
      rateLimit(limiter, {
        rules: [
          {
            name: "api",
            path: "/api/",
            limits: [
              { name: "per-ip", limit: perIp, key: ipKey() },
              { name: "per-key", limit: perKey, key: headerKey("x-api-key") },
            ],
          },
          {
            name: "tagged",
            hashTag: "acct",
            limits: [
              { name: "t-ip", limit: perIp, key: ipKey() },
              { name: "t-key", limit: perKey, key: headerKey("x-api-key") },
            ],
          },
        ],
      }),
    );
    app.get("/api/x", (_q, res) => res.send("ok"));
    app.get("/tagged", (_q, res) => res.send("ok"));
    const s = createServer(app);
    const port = await listen(s);
    closers.push(() => close(s));
    const ipK = identityKey("per-ip", "ip", "127.0.0.1");
    const keyK = identityKey("per-key", "hdr.x-api-key", "k1");
    assert.notEqual(
      keySlot("http:" + ipK),
      keySlot("http:" + keyK),
      "the two identities are in different slots",
    );
    const h = { headers: { "x-api-key": "k1" } };
    const statuses = [];
    for (let i = 0; i < 5; i++) statuses.push((await send(port, "/api/x", h)).status);
    assert.deepEqual(statuses, [200, 200, 429, 429, 429]);
    const denied = await send(port, "/api/x", h);
    assert.equal(denied.body?.["policy"], "per-key");
    assert.match(String(denied.headers["ratelimit"]), /^"per-ip";r=\d+;t=\d+, "per-key";r=0;t=\d+$/);
    assert.equal(
      (await limiter.check(ipK, perIp, { cost: 0 })).remaining,
      98,
      "only the admitted requests charged per-ip",
    );
    // One hash tag: one slot, one RL.ALL.
    const tagged = [];
    for (let i = 0; i < 3; i++) tagged.push((await send(port, "/tagged", h)).status);
    assert.deepEqual(tagged, [200, 200, 429]);
    const tIp = identityKey("t-ip", "ip", "127.0.0.1", "acct");
    assert.equal(tIp, "{acct}:t-ip:ip:127.0.0.1");
    assert.equal((await limiter.check(tIp, perIp, { cost: 0 })).remaining, 98);
  });
});
