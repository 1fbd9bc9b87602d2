// Limits validated when built with the module's rules and messages, and the limit strings
// (docs/clients.md#limits-are-values, docs/clients.md#limit-strings). Table-driven, no server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { GCRA, Window, Lease, parseLimits, formatSeconds, RateLimitConfigError } from "../src/index.js";

function throwsLimit(f: () => unknown, message: string | RegExp, code = "ERR_RL_INVALID_LIMIT") {
  assert.throws(f, (e: unknown) => {
    assert.ok(e instanceof RateLimitConfigError, String(e));
    assert.equal(e.code, code);
    if (typeof message === "string") assert.equal(e.message, message);
    else assert.match(e.message, message);
    return true;
  });
}

const SECONDS = (n: string) =>
  `${n}Ms must be a number of milliseconds (to the nanosecond), > 0 and <= 315360000000 (315360000 s)`;

test("limits are validated when built, with the module's messages", () => {
  const cases: [() => unknown, string][] = [
    [() => new GCRA({ burst: 0, rate: 1, periodMs: 1000 }), "burst must be a positive integer"],
    [() => new GCRA({ burst: 1.5, rate: 1, periodMs: 1000 }), "burst must be a positive integer"],
    [() => new GCRA({ burst: 1, rate: -1, periodMs: 1000 }), "rate must be a positive integer"],
    [() => new GCRA({ burst: 1, rate: 1, periodMs: 0 }), SECONDS("period")],
    [() => new GCRA({ burst: 1, rate: 1, periodMs: NaN }), SECONDS("period")],
    [() => new GCRA({ burst: 1, rate: 1, periodMs: 315_360_000_001 }), SECONDS("period")],
    [
      () => new GCRA({ burst: 1, rate: 10_000_000_000, periodMs: 1 }),
      "rate is too high for period: the emission interval period/rate is below 1 ns",
    ],
    [
      () => new GCRA({ burst: 2n ** 63n, rate: 1, periodMs: 1000 }),
      "burst is too large: burst * period / rate overflows 64-bit nanoseconds",
    ],
    [() => new GCRA({ burst: 2n ** 64n, rate: 1, periodMs: 1000 }), "burst must be at most 2^64 - 1"],
    [
      () => new GCRA({ burst: 2 ** 53, rate: 1, periodMs: 1000 }),
      "burst must be a safe integer (at most 2^53 - 1) or a bigint, not 9007199254740992",
    ],
    [() => new GCRA({ burst: 1, rate: 1, periodMs: 1e300 }), SECONDS("period")],
    [() => new Window({ limit: 0, windowMs: 1000 }), "limit must be a positive integer"],
    [() => new Window({ limit: 1, windowMs: -5 }), SECONDS("window")],
    [
      () => new Window({ limit: 1, windowMs: 1000, algorithm: "TOKEN" as "LOG" }),
      "algorithm must be FIXED, SLIDING or LOG, not 'TOKEN'",
    ],
    [() => new Lease({ limit: 0, leaseMs: 1000 }), "limit must be a positive integer"],
    [() => new Lease({ limit: 1, leaseMs: 0 }), SECONDS("lease")],
    [
      () => new GCRA({ burst: 1, rate: 1, periodMs: 1000, name: "bad\n" }),
      "name must be non-empty printable ASCII (it is sent in HTTP headers)",
    ],
  ];
  for (const [f, msg] of cases) throwsLimit(f, msg);
});

test("unknown options are refused when a limit is built", () => {
  throwsLimit(
    () => new GCRA({ burst: 1, rate: 1, periodMs: 1000, period: 5 } as never),
    /unknown option 'period' for GCRA/,
    "ERR_RL_UNKNOWN_OPTION",
  );
  throwsLimit(
    () => new Window({ limit: 1, window: 5 } as never),
    /unknown option 'window'/,
    "ERR_RL_UNKNOWN_OPTION",
  );
});

test("limits send exact decimal seconds", () => {
  assert.deepEqual(new GCRA({ burst: 10, rate: 5, periodMs: 1500 }).args(), ["10", "5", "1.5"]);
  assert.deepEqual(new Window({ limit: 3, windowMs: 0.000001, algorithm: "log" }).args(), [
    "3",
    "0.000000001",
    "LOG",
  ]);
  assert.deepEqual(new Lease({ limit: 4, leaseMs: 30_000 }).args(), ["4", "30"]);
  assert.equal(formatSeconds(250_000_000n), "0.25");
  assert.equal(new GCRA({ burst: 1, rate: 3, periodMs: 1000 }).intervalNs, 333_333_333n);
  assert.equal(new GCRA({ burst: 1, rate: 1, periodMs: 1000 }).capacity, 1n);
});

test("limit strings as users write them", () => {
  const got = parseLimits("10/minute; 100 per hour, 5/10s;1 per 2 days");
  assert.deepEqual(
    got.map((l) => l.toString()),
    [
      "Window(limit=10, window=60s, SLIDING)",
      "Window(limit=100, window=3600s, SLIDING)",
      "Window(limit=5, window=10s, SLIDING)",
      "Window(limit=1, window=172800s, SLIDING)",
    ],
  );
  assert.equal(parseLimits("5/s", "GCRA")[0]!.toString(), "GCRA(burst=5, rate=5, period=1s)");
  assert.equal(parseLimits("5/s", "fixed" as "FIXED")[0]!.toString(), "Window(limit=5, window=1s, FIXED)");
  const bad: [string, string][] = [
    ["", "no limit in ''"],
    ["10/minute;", "empty limit in '10/minute;' (limits are separated by ';' or ',')"],
    ["minute", "limit 'minute': expected '<count>/<unit>' or '<count> per <unit>', starting with the count"],
    [
      "10 minute",
      "limit '10 minute': expected '/' or 'per' after the count, as in '10/minute' or '10 per minute'",
    ],
    [
      "10/fortnight",
      "limit '10/fortnight': unknown unit 'fortnight' (s, sec, second(s), m, min, minute(s), h, hr, hour(s), d, day(s))",
    ],
    ["0/s", "limit '0/s': limit must be a positive integer"],
    ["1/0s", "limit '1/0s': the number of units must be a positive integer"],
    ["1/9999999999d", "limit '1/9999999999d': the window must be at most 315360000 s"],
  ];
  for (const [text, msg] of bad) throwsLimit(() => parseLimits(text), msg);
});
