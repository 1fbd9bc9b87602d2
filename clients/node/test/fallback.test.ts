// The Lua fallback where users are (docs/clients.md#the-fallback-where-users-are): the
// Functions library loaded when missing and reloaded after a flush, a newer one never
// replaced, scripts (EVAL, then EVALSHA) where FUNCTION is refused with NOSCRIPT recovered,
// the one clear error where nothing can run, and out of memory (docs/clients.md#out-of-memory).
import { describe, test, after, before } from "node:test";
import assert from "node:assert/strict";
import { Redis } from "ioredis";
import {
  GCRA,
  Window,
  LibraryError,
  LUA_LIBRARY_TEXT,
  LIBRARY_VERSION,
  RateLimiter,
  type LimiterEvent,
} from "../src/index.js";
import { Server, LIBS, limiterFor } from "./harness.js";

const w = new Window({ limit: 2, windowMs: 60_000 });

async function withRedis<T>(port: number, f: (r: Redis) => Promise<T>): Promise<T> {
  const r = new Redis({ port, host: "127.0.0.1" });
  try {
    return await f(r);
  } finally {
    r.disconnect();
  }
}

describe("the Functions library", () => {
  let s: Server;
  before(async () => {
    s = await new Server(false).start();
  });
  after(async () => s.remove());

  for (const lib of LIBS) {
    test(`loaded when missing, and again after FUNCTION FLUSH (${lib})`, async () => {
      await s.do("FUNCTION", "FLUSH");
      const events: LimiterEvent[] = [];
      const { limiter, close } = await limiterFor(lib, s.port, { onEvent: (e) => events.push(e) });
      try {
        assert.equal((await limiter.check(`flush-${lib}`, w)).source, "fallback");
        assert.ok(events.some((e) => e.type === "library-loaded"));
        assert.match(
          await s.do("FCALL_RO", "rl_version", "0"),
          new RegExp(LIBRARY_VERSION.replace(/\./g, "\\.")),
        );
        await s.do("FUNCTION", "FLUSH");
        const d = await limiter.check(`flush-${lib}`, w);
        assert.equal(d.allowed, true);
        assert.equal(d.remaining, 0);
      } finally {
        await close();
      }
    });
  }

  test("a newer library on the server is left in place and answers", async () => {
    await s.do("FUNCTION", "FLUSH");
    const newer = LUA_LIBRARY_TEXT.replace(
      `local VERSION = '${LIBRARY_VERSION}'`,
      "local VERSION = '99.0.0'",
    );
    await withRedis(s.port, (r) => r.call("FUNCTION", "LOAD", newer));
    const events: LimiterEvent[] = [];
    const { limiter, close } = await limiterFor("ioredis", s.port, { onEvent: (e) => events.push(e) });
    try {
      assert.equal((await limiter.check("newer", w)).allowed, true);
      assert.ok(events.some((e) => e.type === "library-newer"));
      assert.match(await s.do("FCALL_RO", "rl_version", "0"), /99\.0\.0/);
    } finally {
      await close();
    }
  });

  test("an older library is replaced, its operator's settings kept", async () => {
    await s.do("FUNCTION", "FLUSH");
    const older = LUA_LIBRARY_TEXT.replace(
      `local VERSION = '${LIBRARY_VERSION}'`,
      "local VERSION = '0.9.0'",
    ).replace("local ALL_MAX_KEYS = 64\n", "local ALL_MAX_KEYS = 7\n");
    await withRedis(s.port, (r) => r.call("FUNCTION", "LOAD", older));
    const { limiter, close } = await limiterFor("ioredis", s.port);
    try {
      assert.equal((await limiter.check("older", w)).allowed, true);
      const v = await withRedis(s.port, (r) => r.call("FCALL_RO", "rl_version", "0"));
      assert.equal(v, LIBRARY_VERSION);
      const config = (await withRedis(s.port, (r) => r.call("FCALL_RO", "rl_config", "0"))) as unknown[];
      assert.equal(config[config.indexOf("all-max-keys") + 1], 7);
    } finally {
      await close();
    }
  });

  test("loadLibrary false and no library: one clear LibraryError", async () => {
    await s.do("FUNCTION", "FLUSH");
    const { limiter, close } = await limiterFor("ioredis", s.port, { loadLibrary: false });
    try {
      await assert.rejects(limiter.check("nolib", w), (e: unknown) => {
        assert.ok(e instanceof LibraryError, String(e));
        assert.match(e.message, /not loaded and loading it is not allowed/);
        return true;
      });
    } finally {
      await close();
    }
  });
});

describe("as scripts where FUNCTION is refused", () => {
  let s: Server;
  before(async () => {
    s = await new Server(false, ["--rename-command", "FUNCTION", ""]).start();
  });
  after(async () => s.remove());

  for (const lib of LIBS) {
    test(`EVAL, then EVALSHA, and NOSCRIPT recovered after SCRIPT FLUSH (${lib})`, async () => {
      const events: LimiterEvent[] = [];
      const { limiter, close } = await limiterFor(lib, s.port, { onEvent: (e) => events.push(e) });
      try {
        const g = new GCRA({ burst: 3, rate: 1, periodMs: 60_000 });
        assert.equal((await limiter.check(`s-${lib}`, g)).remaining, 2);
        assert.ok(events.some((e) => e.type === "scripts"));
        assert.equal((await limiter.check(`s-${lib}`, g)).remaining, 1);
        await s.do("SCRIPT", "FLUSH");
        const d = await limiter.check(`s-${lib}`, g);
        assert.equal(d.allowed, true);
        assert.equal(d.remaining, 0);
        assert.equal(d.source, "fallback");
      } finally {
        await close();
      }
    });
  }
});

describe("an ACL that refuses some of the forms", () => {
  let s: Server;
  before(async () => {
    s = await new Server(false).start();
    await s.do("ACL", "SETUSER", "noeval", "on", "nopass", "~*", "&*", "+@all", "-function", "-eval");
    await s.do("ACL", "SETUSER", "noevalsha", "on", "nopass", "~*", "&*", "+@all", "-function", "-evalsha");
  });
  after(async () => s.remove());

  for (const user of ["noeval", "noevalsha"]) {
    test(`FUNCTION and ${user === "noeval" ? "EVAL" : "EVALSHA"} refused: the other script form answers`, async () => {
      await s.do("FUNCTION", "FLUSH");
      await s.do("SCRIPT", "FLUSH");
      const client = new Redis({ port: s.port, host: "127.0.0.1", username: user, password: "x" });
      try {
        const limiter = new RateLimiter({ client, prefix: `${user}:` });
        const g = new GCRA({ burst: 2, rate: 1, periodMs: 60_000 });
        assert.equal((await limiter.check("k", g)).remaining, 1);
        assert.equal((await limiter.check("k", g)).remaining, 0);
        await s.do("SCRIPT", "FLUSH");
        const d = await limiter.check("k", g);
        assert.equal(d.allowed, false);
        assert.equal(d.source, "fallback");
      } finally {
        client.disconnect();
      }
    });
  }
});

describe("no module and no scripting", () => {
  let s: Server;
  before(async () => {
    s = await new Server(false, [
      ...["FUNCTION", "FCALL", "FCALL_RO", "EVAL", "EVALSHA"].flatMap((c) => ["--rename-command", c, ""]),
    ]).start();
  });
  after(async () => s.remove());

  test("one clear error names what is missing", async () => {
    const { limiter, close } = await limiterFor("ioredis", s.port);
    try {
      await assert.rejects(limiter.check("x", w), (e: unknown) => {
        assert.ok(e instanceof LibraryError, String(e));
        assert.match(e.message, /no redis-rl module .* refuses the Lua fallback/);
        return true;
      });
    } finally {
      await close();
    }
  });
});

for (const module of [true, false]) {
  describe(`out of memory (${module ? "module" : "fallback"})`, () => {
    let s: Server;
    before(async () => {
      s = await new Server(module).start();
    });
    after(async () => s.remove());

    test("a full Redis refuses writes (an outage for the policy) and still denies", async () => {
      const events: LimiterEvent[] = [];
      const client = new Redis({ port: s.port, host: "127.0.0.1" });
      after(() => client.disconnect());
      const limiter = new RateLimiter({
        client,
        onError: "raise",
        probeIntervalMs: 10,
        onEvent: (e) => events.push(e),
      });
      const g = new GCRA({ burst: 1, rate: 1, periodMs: 60_000 });
      assert.equal((await limiter.check("full", g)).allowed, true);
      await s.do("CONFIG", "SET", "maxmemory", "1");
      try {
        const denied = await limiter.check("full", g);
        assert.equal(denied.allowed, false);
        assert.equal(denied.degraded, false);
        assert.equal((await limiter.check("full", g, { peek: true })).allowed, false);
        await assert.rejects(limiter.check("other", g), (e: unknown) => {
          assert.match(String((e as Error).cause ?? e), /OOM/);
          return true;
        });
      } finally {
        await s.do("CONFIG", "SET", "maxmemory", "0");
      }
      await new Promise((r) => setTimeout(r, 20)); // past the probe interval
      assert.equal((await limiter.check("other", g)).allowed, true);
      assert.ok(events.some((e) => e.type === "outage"));
      assert.ok(events.some((e) => e.type === "recovered"));
    });
  });
}
