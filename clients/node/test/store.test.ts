// RedisRlStore under express-rate-limit (both from the npm registry), against real
// redis-server processes: the counts express-rate-limit decides on, a skipped request given
// back, resetKey and getKey, no outage after the server forgets the fallback (FUNCTION FLUSH,
// SCRIPT FLUSH, a restart), an outage answered 503, and the same limit kept exactly as
// rate-limit-redis keeps it when two servers share one Redis.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server as HttpServer } from "node:http";
import express from "express";
import { rateLimit, type Options, type RateLimitRequestHandler } from "express-rate-limit";
import { RedisStore } from "rate-limit-redis";
import { Redis } from "ioredis";
import { createClient } from "redis";
import { RedisRlStore } from "../src/http/store.js";
import { Server, uniquePrefix } from "./harness.js";
import { send, listen, close } from "./http-helpers.js";

const month = 30 * 24 * 3_600_000;

for (const module of [true, false]) {
  describe(`express-rate-limit with RedisRlStore (${module ? "module" : "fallback"})`, () => {
    let redis: Server;
    const closers: (() => Promise<void>)[] = [];
    before(async () => {
      redis = await new Server(module).start();
    });
    after(async () => {
      for (const c of closers.reverse()) await c();
      await redis.remove();
    });
    const ioredis = () => {
      const c = new Redis({ port: redis.port, host: "127.0.0.1", maxRetriesPerRequest: 1 });
      c.on("error", () => {});
      closers.push(async () => void c.disconnect());
      return c;
    };
    const serve = async (options: Partial<Options>, routes?: (app: ReturnType<typeof express>) => void) => {
      const app = express();
      const limiter: RateLimitRequestHandler = rateLimit({
        standardHeaders: "draft-8",
        legacyHeaders: false,
        ...options,
      });
      app.use(limiter);
      routes?.(app);
      app.get("/", (req, res) => res.json((req as unknown as { rateLimit: unknown }).rateLimit));
      const s: HttpServer = createServer(app);
      const port = await listen(s);
      closers.push(() => close(s));
      return { port, limiter };
    };

    test("increment counts every hit exactly, through ioredis and node-redis send-functions", async () => {
      const io = ioredis();
      const nr = createClient({ socket: { port: redis.port, host: "127.0.0.1" } });
      nr.on("error", () => {});
      await nr.connect();
      closers.push(async () => nr.destroy());
      const prefix = uniquePrefix("store counts");
      const stores = [
        new RedisRlStore({
          sendCommand: (command: string, ...args: string[]) => io.call(command, ...args),
          prefix,
        }),
        new RedisRlStore({ sendCommand: (...args: string[]) => nr.sendCommand(args), prefix }),
      ];
      const [a, b] = [
        await serve({ windowMs: month, limit: 3, store: stores[0]! }),
        await serve({ windowMs: month, limit: 3, store: stores[1]! }),
      ];
      const used: unknown[] = [];
      const sent = Date.now(); // before the first hit: the window holding them ends after it
      for (let i = 0; i < 5; i++) {
        const r = await send(i % 2 ? b.port : a.port, "/");
        used.push(r.status === 200 ? (r.body as { used: number }).used : r.status);
      }
      assert.deepEqual(used, [1, 2, 3, 429, 429]);
      assert.equal(stores[0]!.localKeys, false);
      assert.equal(stores[0]!.prefix, prefix);
      const got = await a.limiter.getKey("127.0.0.1");
      assert.equal(got?.totalHits, 5, "denied hits count, as rate-limit-redis counts them");
      assert.ok(got!.resetTime!.getTime() > sent, "the window's end is after its hits");
      await a.limiter.resetKey("127.0.0.1");
      assert.equal(await a.limiter.getKey("127.0.0.1"), undefined);
      assert.equal((await send(b.port, "/")).status, 200);
    });

    test("a skipped request is given back (decrement); the key escaped so it cannot pick a hash tag", async () => {
      const io = ioredis();
      const prefix = uniquePrefix("store skip");
      const store = new RedisRlStore({ client: io, prefix });
      const { port } = await serve(
        { windowMs: month, limit: 2, store, skipFailedRequests: true, keyGenerator: () => "{tenant}:1" },
        (app) => app.get("/fail", (_q, res) => res.status(500).send("no")),
      );
      for (let i = 0; i < 4; i++) assert.equal((await send(port, "/fail")).status, 500);
      assert.deepEqual(
        [(await send(port, "/")).status, (await send(port, "/")).status, (await send(port, "/")).status],
        [200, 200, 429],
      );
      assert.equal(await io.exists(`${prefix}%7Btenant%7D:1`), 1);
    });

    test("no outage when the server forgets the fallback or restarts; an outage is a 503", async () => {
      const io = ioredis();
      const store = new RedisRlStore({ client: io, prefix: uniquePrefix("store restart") });
      const { port } = await serve({ windowMs: month, limit: 100, store });
      const used = async () => {
        const r = await send(port, "/");
        assert.equal(r.status, 200, r.text);
        return (r.body as { used: number }).used;
      };
      assert.deepEqual([await used(), await used()], [1, 2]);
      await redis.do("FUNCTION", "FLUSH");
      await redis.do("SCRIPT", "FLUSH");
      assert.equal(await used(), 3);
      await redis.restart();
      assert.equal(await used(), 1, "answered by the restarted server (nothing persisted)");
      assert.equal(await used(), 2);
      await redis.kill();
      const down = await send(port, "/");
      assert.equal(down.status, 503, "express's error handler answers the store's StoreUnavailableError");
      await redis.start();
    });

    test("two servers sharing one Redis admit exactly the limit, as rate-limit-redis does", async () => {
      const limit = 7;
      const admitted: Record<string, number> = {};
      for (const kind of ["redis-rl", "rate-limit-redis"]) {
        const ports: number[] = [];
        const prefix = uniquePrefix(kind);
        for (let s = 0; s < 2; s++) {
          const io = ioredis();
          const sendCommand = (command: string, ...args: string[]) =>
            io.call(command, ...args) as Promise<never>;
          const store =
            kind === "redis-rl"
              ? new RedisRlStore({ sendCommand, prefix })
              : new RedisStore({ sendCommand, prefix });
          ports.push((await serve({ windowMs: month, limit, store })).port);
        }
        let ok = 0;
        for (let batch = 0; batch < 4; batch++) {
          const replies = await Promise.all(Array.from({ length: 10 }, (_, i) => send(ports[i % 2]!, "/")));
          for (const r of replies) {
            assert.ok(r.status === 200 || r.status === 429, `${kind}: ${r.status} ${r.text}`);
            if (r.status === 200) ok++;
          }
        }
        admitted[kind] = ok;
      }
      assert.deepEqual(admitted, { "redis-rl": limit, "rate-limit-redis": limit });
    });
  });
}

test("RedisRlStore's options are checked when built", () => {
  const send = async () => null;
  assert.throws(() => new RedisRlStore({ sendCommand: send, windowMs: 1 } as never), {
    code: "ERR_RL_UNKNOWN_OPTION",
  });
  assert.throws(() => new RedisRlStore({} as never), { code: "ERR_RL_USAGE" });
  assert.throws(() => new RedisRlStore({ sendCommand: send, prefix: "{x}" }), {
    code: "ERR_RL_INVALID_OPTION",
  });
  const store = new RedisRlStore({ sendCommand: send });
  assert.throws(() => store.init({ windowMs: 0 }), { code: "ERR_RL_INVALID_LIMIT" });
  assert.equal(store.prefix, "rl:");
});
