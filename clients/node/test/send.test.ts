// One send-function serves every client library (rate-limit-redis's sendCommand): the
// limiter given `sendCommand` instead of a client decides exactly as with the client, error
// replies included; concurrent first calls share one detection and one library load.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Redis } from "ioredis";
import { createClient } from "redis";
import {
  GCRA,
  Window,
  RateLimiter,
  RateLimitConfigError,
  RedisReplyError,
  type LimiterEvent,
} from "../src/index.js";
import { Server } from "./harness.js";

for (const module of [true, false]) {
  describe(`sendCommand (${module ? "module" : "fallback"})`, () => {
    let s: Server;
    let io: Redis;
    let nr: ReturnType<typeof createClient>;
    before(async () => {
      s = await new Server(module).start();
      io = new Redis({ port: s.port, host: "127.0.0.1" });
      nr = createClient({ socket: { port: s.port, host: "127.0.0.1" } });
      await nr.connect();
    });
    after(async () => {
      io.disconnect();
      nr.destroy();
      await s.remove();
    });

    test("a plain send-function over ioredis and over node-redis", async () => {
      const sends = {
        ioredis: (args: string[]) => io.call(args[0]!, ...args.slice(1)),
        "node-redis": (args: string[]) => nr.sendCommand(args),
      };
      for (const [name, sendCommand] of Object.entries(sends)) {
        const limiter = new RateLimiter({ sendCommand, prefix: `send.${name}:` });
        const g = new GCRA({ burst: 2, rate: 1, periodMs: 60_000 });
        assert.equal((await limiter.check("k", g)).remaining, 1);
        assert.equal((await limiter.check("k", g)).remaining, 0);
        const d = await limiter.check("k", g);
        assert.equal(d.allowed, false);
        assert.equal(d.source, module ? "module" : "fallback");
        await assert.rejects(limiter.check("k", new Window({ limit: 1, windowMs: 1000 })), RedisReplyError);
      }
    });

    test("concurrent first calls share one detection and one library load", async () => {
      if (!module) await s.do("FUNCTION", "FLUSH");
      const events: LimiterEvent[] = [];
      const limiter = new RateLimiter({ client: io, prefix: "concurrent:", onEvent: (e) => events.push(e) });
      const w = new Window({ limit: 10, windowMs: 60_000 });
      const all = await Promise.all(Array.from({ length: 20 }, () => limiter.check("k", w)));
      assert.equal(all.filter((d) => d.allowed).length, 10);
      assert.equal(events.filter((e) => e.type === "library-loaded").length, module ? 0 : 1);
    });
  });
}

test("the limiter's options are validated when it is built", () => {
  const io = new Redis({ lazyConnect: true });
  const cases: [object, string, RegExp][] = [
    [{ client: io, bogus: 1 }, "ERR_RL_UNKNOWN_OPTION", /unknown option 'bogus' for RateLimiter/],
    [{ client: io, onError: "lokal" }, "ERR_RL_INVALID_OPTION", /"open", "closed", "raise" or "local"/],
    [
      { client: io, onError: "local", fleetSize: 0 },
      "ERR_RL_INVALID_OPTION",
      /fleetSize must be an integer of at least 1/,
    ],
    [{ client: io, fleetSize: 1.5 }, "ERR_RL_INVALID_OPTION", /fleetSize/],
    [{ client: io, batch: 0 }, "ERR_RL_INVALID_LIMIT", /batch must be a positive integer/],
    [{ client: io, batch: "8" }, "ERR_RL_INVALID_LIMIT", /batch must be a positive integer/],
    [{ client: io, batchHoldMs: 0 }, "ERR_RL_INVALID_OPTION", /batchHoldMs/],
    [{ client: io, mode: "lua" }, "ERR_RL_INVALID_OPTION", /mode must be/],
    [{ client: io, prefix: "{x}" }, "ERR_RL_INVALID_OPTION", /prefix/],
    [{ client: io, timeoutMs: 0 }, "ERR_RL_INVALID_OPTION", /timeoutMs/],
    [{ client: io, onEvent: "log" }, "ERR_RL_INVALID_OPTION", /onEvent must be a function/],
    [{ client: io, denyCache: "yes" }, "ERR_RL_INVALID_OPTION", /denyCache must be a boolean/],
    [{}, "ERR_RL_USAGE", /needs a client/],
    [{ client: {} }, "ERR_RL_USAGE", /neither an ioredis nor a node-redis client/],
    [{ client: io, sendCommand: async () => 1 }, "ERR_RL_USAGE", /either client or sendCommand/],
  ];
  for (const [options, code, message] of cases) {
    assert.throws(
      () => new RateLimiter(options as never),
      (e: unknown) => e instanceof RateLimitConfigError && e.code === code && message.test(e.message),
      JSON.stringify(Object.keys(options)),
    );
  }
  io.disconnect();
});
