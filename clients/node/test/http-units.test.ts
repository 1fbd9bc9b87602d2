// The HTTP layer's pure parts, with the Go package's vectors (clients/go/rlhttp/clientip_test.go,
// paths_test.go, clients/go/unit_test.go) so the packages key and match to the byte alike:
// the client IP behind trusted proxies, escaped identity values, normalised paths (with the
// dot segments this package resolves), path patterns, limit names, declared costs.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { RateLimitConfigError, Window, GCRA, Lease, RateLimiter } from "../src/index.js";
import {
  ClientIp,
  UNKNOWN_IP,
  headerCost,
  identityKey,
  matchPath,
  namedLimits,
  normalizeList,
  normalizePath,
  safeKeyPart,
  HttpLimiter,
  ipKey,
} from "../src/http/index.js";
import { rateLimit } from "../src/http/express.js";

function headers(...kv: string[]): (name: string) => string[] {
  const h = new Map<string, string[]>();
  for (let i = 0; i + 1 < kv.length; i += 2) {
    const k = kv[i]!.toLowerCase();
    h.set(k, [...(h.get(k) ?? []), kv[i + 1]!]);
  }
  return (n) => h.get(n) ?? [];
}

const keyOf = (c: ClientIp, peer: string | undefined, h = headers()) => c.resolve(peer, h).key;

describe("client IP", () => {
  test("forwarding headers from untrusted peers are ignored", () => {
    assert.equal(
      keyOf(
        new ClientIp({ trustedProxies: ["10.0.0.0/8"] }),
        "203.0.113.9",
        headers("X-Forwarded-For", "1.2.3.4"),
      ),
      "203.0.113.9",
    );
    assert.equal(keyOf(new ClientIp(), "10.0.0.1", headers("X-Forwarded-For", "1.2.3.4")), "10.0.0.1");
  });

  test("X-Forwarded-For is walked from the right, skipping trusted proxies", () => {
    const c = new ClientIp({ trustedProxies: ["10.0.0.0/8", "192.0.2.1"] });
    const cases: [(n: string) => string[], string][] = [
      [headers("X-Forwarded-For", "6.6.6.6, 198.51.100.7, 192.0.2.1, 10.1.1.1"), "198.51.100.7"],
      [headers(), "10.0.0.5"],
      [headers("X-Forwarded-For", "10.2.2.2, 10.3.3.3"), "10.2.2.2"],
      [headers("X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.8"), "198.51.100.8"],
    ];
    for (const [h, want] of cases) assert.equal(keyOf(c, "10.0.0.5", h), want);
  });

  test("Forwarded is read only when configured, never both", () => {
    const fwd = 'for=6.6.6.6, for="[2001:db8::1]:4711";proto=https, for=10.0.0.2';
    assert.equal(
      keyOf(new ClientIp({ trustedProxies: ["10.0.0.0/8"] }), "10.0.0.1", headers("Forwarded", fwd)),
      "10.0.0.1",
    );
    const c = new ClientIp({ trustedProxies: ["10.0.0.0/8"], header: "forwarded" });
    assert.equal(keyOf(c, "10.0.0.1", headers("Forwarded", fwd)), "2001:db8::/64");
    assert.equal(
      keyOf(c, "10.0.0.1", headers("Forwarded", fwd, "X-Forwarded-For", "9.9.9.9")),
      "2001:db8::/64",
    );
    const cases: [string, string, boolean][] = [
      ['for="1.1.1.1"', "1.1.1.1", false],
      ["for=1.1.1.1", "1.1.1.1", false],
      ['for="1.1.1.1', "10.0.0.1", true],
      ['for=1.1.1.1"', "10.0.0.1", true],
      ['for="1.1.1".1"', "10.0.0.1", true],
      ['for=""', "10.0.0.1", true],
      ['for="[2001:db8::1]:4711', "10.0.0.1", true],
      ["proto=https", "10.0.0.1", true],
      ["for=unknown", "10.0.0.1", true],
      ["for=_hidden", "10.0.0.1", true],
    ];
    for (const [value, want, unusable] of cases) {
      const r = c.resolve("10.0.0.1", headers("Forwarded", value));
      assert.deepEqual([r.key, r.unknown, r.unusable], [want, false, unusable], value);
    }
  });

  test("ports, IPv6 by its /64, IPv4-mapped as IPv4", () => {
    const c = new ClientIp({ trustedProxies: ["::1"] });
    assert.equal(keyOf(c, "::1", headers("X-Forwarded-For", "198.51.100.7:5555")), "198.51.100.7");
    assert.equal(keyOf(c, "::1", headers("X-Forwarded-For", "[2001:DB8:0::1]:80")), "2001:db8::/64");
    assert.equal(keyOf(new ClientIp(), "2001:db8:0:0:9:8:7:6"), "2001:db8::/64");
    assert.equal(new ClientIp().keyOf("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
    assert.equal(keyOf(new ClientIp({ ipv6Prefix: 128 }), "2001:db8::1"), "2001:db8::1");
    assert.equal(keyOf(new ClientIp({ ipv6Prefix: 56 }), "2001:db8:1:2ff::1"), "2001:db8:1:200::/56");
    for (const bits of [47, 129, 64.5]) {
      assert.throws(() => new ClientIp({ ipv6Prefix: bits }), { code: "ERR_RL_INVALID_OPTION" });
    }
    assert.equal(keyOf(new ClientIp(), "::ffff:192.0.2.7"), "192.0.2.7");
    assert.equal(keyOf(new ClientIp(), undefined), UNKNOWN_IP);
    assert.throws(() => new ClientIp({ trustedProxies: ["not-a-network"] }), {
      message: "trusted proxy 'not-a-network' is not an address or network",
    });
    const m = new ClientIp({ trustedProxies: ["::ffff:10.0.0.0/104"] });
    assert.equal(keyOf(m, "10.1.2.3", headers("X-Forwarded-For", "198.51.100.1")), "198.51.100.1");
    assert.equal(keyOf(m, "::ffff:10.1.2.3", headers("X-Forwarded-For", "198.51.100.1")), "198.51.100.1");
    // RFC 5952: the longest run of zero groups (two or more) is "::", the first of equal runs.
    assert.equal(new ClientIp({ ipv6Prefix: 128 }).keyOf("2001:0:0:1:0:0:0:1"), "2001:0:0:1::1");
    assert.equal(new ClientIp({ ipv6Prefix: 128 }).keyOf("2001:db8:0:1:1:1:1:1"), "2001:db8:0:1:1:1:1:1");
    assert.equal(new ClientIp({ ipv6Prefix: 128 }).keyOf("2001:0:0:1:1:0:0:1"), "2001::1:1:0:0:1");
    // Unusable entries fall back to the peer and are reported; an empty list too.
    const t = new ClientIp({ trustedProxies: ["10.0.0.0/8"] });
    for (const v of ["garbage", ":80", "1.2.3", "01.2.3.4", "fe80::1%eth0", " , "]) {
      const r = t.resolve("10.0.0.1", headers("X-Forwarded-For", v));
      assert.deepEqual([r.key, r.unusable], ["10.0.0.1", true], v);
    }
  });

  test('"unix" trusts a peer without an address', () => {
    const c = new ClientIp({ trustedProxies: ["unix"] });
    assert.equal(keyOf(c, undefined, headers("X-Forwarded-For", "198.51.100.7")), "198.51.100.7");
    const r = new ClientIp().resolve(undefined, headers("X-Forwarded-For", "198.51.100.7"));
    assert.deepEqual([r.key, r.unknown], [UNKNOWN_IP, true]);
  });

  test("fromFramework keys the framework's address the same way, and excludes trustedProxies", () => {
    const c = new ClientIp({ fromFramework: true });
    assert.equal(c.fromAddress("::ffff:198.51.100.7").key, "198.51.100.7");
    assert.equal(c.fromAddress("2001:db8::5").key, "2001:db8::/64");
    assert.deepEqual(c.fromAddress(undefined), { key: UNKNOWN_IP, unknown: true, unusable: false });
    assert.throws(() => new ClientIp({ fromFramework: true, trustedProxies: ["10.0.0.1"] }), {
      code: "ERR_RL_INVALID_OPTION",
    });
    assert.throws(() => new ClientIp({ trusted: ["x"] } as never), { code: "ERR_RL_UNKNOWN_OPTION" });
  });
});

test("identity values are escaped and keyed as every package keys them", () => {
  assert.equal(
    safeKeyPart("a".repeat(200)),
    "~sha256:c2a908d98f5df987ade41b5fce213067efbcc21ef2240212a41e54b5e7c28ae5",
  );
  assert.equal(safeKeyPart("é".repeat(64)), "%C3%A9".repeat(64));
  assert.equal(safeKeyPart("~x"), "%7Ex");
  assert.equal(identityKey("api", "ip", "192.0.2.7"), "api:{ip:192.0.2.7}");
  assert.equal(identityKey("api", "hdr.x-api-key", "k{1}", "acct"), "{acct}:api:hdr.x-api-key:k%7B1%7D");
  assert.equal(identityKey("api", "ip", "unknown"), "api:{ip:unknown}");
  assert.equal(normalizeList([" a ,b", "\tc", "a,,b"]), "a, b, c, a, , b");
});

test("paths are decoded once, collapsed, dot segments resolved, no trailing slash", () => {
  const cases: Record<string, string> = {
    "/api//Things/": "/api/Things",
    "/api/%54hings": "/api/Things",
    "": "/",
    "/": "/",
    "//": "/",
    api: "/api",
    "/a%2Fb": "/a/b",
    "/a%zz": "/a%zz",
    "/a%4": "/a%4",
    "/%C3%A9": "/é",
    "/%E2%82": "/\uFFFD",
    "/%FF%FE": "/\uFFFD\uFFFD",
    "/%E2%82x": "/\uFFFDx",
    "/%ED%A0%80": "/\uFFFD\uFFFD\uFFFD",
    "/%F0%9F%98%80": "/😀",
    "/%F4%90%80%80": "/\uFFFD\uFFFD\uFFFD\uFFFD",
    "/%E0%80%AF": "/\uFFFD\uFFFD\uFFFD",
    "/%C0%AF": "/\uFFFD\uFFFD",
    "/%EF%BB%BFx": "/\uFEFFx",
    // . and .. resolved (RFC 3986 5.2.4) after decoding, as in Go, Python and Rust; no query.
    "/static/../api": "/api",
    "/static/%2e%2e/api?x=1": "/api",
    "/a/./b/.": "/a/b",
    "/../..": "/",
    "/a/b/..": "/a",
    "http://example.com/x//y/?q": "/x/y",
  };
  for (const [input, want] of Object.entries(cases)) assert.equal(normalizePath(input), want, input);
});

test("path patterns: glob, prefix, exact (Go's MatchPath vectors)", () => {
  const cases: [string, string, boolean][] = [
    ["/users/*/avatar", "/users/3/avatar", true],
    ["*", "/anything/at/all", true],
    ["/users/*/avatar", "/users/3/avatars", false],
    ["/users/*", "/users/a/b", true],
    ["/v?/x*", "/v2/x", true],
    ["/v?/x*", "/v22/x", false],
    ["/v?/x", "/v2/x", false],
    ["/v?/x", "/v?/x", true],
    ["/v[0-9]/*", "/v7/y", true],
    ["/v[!0-9]/*", "/v7/y", false],
    ["/v[!0-9]/*", "/vx/y", true],
    ["/a[/b*", "/a[/bc", true],
    ["/[]]*", "/]x", true],
    ["/é?*", "/éa", true],
    ["/x/*.css", "/x/a/b.css", true],
    ["/x/*.css", "/x/a/b.cs", false],
    ["*/end", "/a/b/end", true],
    ["/api/", "/api", true],
    ["/api/", "/api/x", true],
    ["/api/", "/apix", false],
    ["/", "/anything", true],
    ["/health", "/health", true],
    ["/health/", "/health", true],
    ["/health", "/health/x", false],
    ["//health/", "/health", false],
    ["/Health", "/health", false],
  ];
  for (const [p, path, want] of cases) assert.equal(matchPath(p, path), want, `${p} ${path}`);
});

test("limits are named <rule>-<window seconds>s, -2 for a second equal window", () => {
  const n = namedLimits("api", [
    new Window({ limit: 20, windowMs: 60_000 }),
    new Window({ limit: 200, windowMs: 3_600_000 }),
    new GCRA({ burst: 5, rate: 5, periodMs: 60_000 }),
    new Lease({ limit: 2, leaseMs: 30_000 }),
    new Window({ limit: 1, windowMs: 1500, name: "own" }),
  ]);
  assert.deepEqual(
    n.map((x) => x.name),
    ["api-60s", "api-3600s", "api-60s-2", "api-0s", "own"],
  );
  assert.deepEqual(
    namedLimits("one", [new Window({ limit: 1, windowMs: 1000 })]).map((x) => x.name),
    ["one"],
  );
});

test("a declared cost: absent, empty, not decimal or 0 is 1; 2^64 or more never", () => {
  assert.deepEqual(headerCost([]), { cost: 1n, never: false });
  assert.deepEqual(headerCost([" "]), { cost: 1n, never: false });
  assert.deepEqual(headerCost(["-3"]), { cost: 1n, never: false });
  assert.deepEqual(headerCost(["0"]), { cost: 1n, never: false });
  assert.deepEqual(headerCost([" 7 "]), { cost: 7n, never: false });
  assert.deepEqual(headerCost(["18446744073709551615"]), { cost: 18446744073709551615n, never: false });
  assert.deepEqual(headerCost(["18446744073709551616"]), { cost: 0n, never: true });
});

test("the middlewares' options are checked when built: unknown ones refused, coded", () => {
  const limiter = new RateLimiter({ sendCommand: async () => null });
  const w = new Window({ limit: 1, windowMs: 1000 });
  const bad: [unknown, string, RegExp?][] = [
    [{ rules: [], windowMs: 1000 }, "ERR_RL_UNKNOWN_OPTION", /unknown option 'windowMs'/],
    [{ rules: [{ name: "a", limit: w, key: ipKey(), max: 3 }] }, "ERR_RL_UNKNOWN_OPTION", /'max'/],
    [{ rules: [{ name: "a", limit: w }] }, "ERR_RL_INVALID_OPTION", /needs a key/],
    [{ rules: [{ limit: w, key: ipKey() }] }, "ERR_RL_INVALID_OPTION", /needs a name/],
    [{ rules: [{ name: "a", key: ipKey() }] }, "ERR_RL_INVALID_OPTION", /give limit too/],
    [{ rules: [{ name: "a", limit: "10/fortnight", key: ipKey() }] }, "ERR_RL_INVALID_LIMIT", /unknown unit/],
    [
      { rules: [{ name: "a", limit: w, key: ipKey(), cost: 2, costHeader: "x-cost" }] },
      "ERR_RL_INVALID_OPTION",
    ],
    [{ rules: [{ name: "a", limit: w, key: ipKey(), missing: "allow" }] }, "ERR_RL_INVALID_OPTION"],
    [{ rules: [{ name: "a", limit: w, key: ipKey(), hashTag: "{x}" }] }, "ERR_RL_INVALID_OPTION"],
    [{ rules: [{ name: "a\n", limit: w, key: ipKey() }] }, "ERR_RL_INVALID_OPTION"],
    [{ rules: [], clientIp: { trustedProxies: ["nope"] } }, "ERR_RL_INVALID_OPTION"],
    [{ rules: [], handler: 3 }, "ERR_RL_INVALID_OPTION"],
    [
      {
        rules: [
          { name: "first", limits: [{ name: "x", limit: w, key: ipKey() }] },
          {
            name: "second",
            limits: [{ name: "x", limit: new Window({ limit: 2, windowMs: 1000 }), key: ipKey() }],
          },
        ],
      },
      "ERR_RL_INVALID_OPTION",
      /limit name 'x' names two different limits, in first and second/,
    ],
  ];
  for (const [options, code, message] of bad) {
    assert.throws(
      () => rateLimit(limiter, options as never),
      (e: unknown) =>
        e instanceof RateLimitConfigError && e.code === code && (!message || message.test(e.message)),
      JSON.stringify(options, (_k, v) => (typeof v === "bigint" ? String(v) : v)),
    );
  }
  assert.throws(() => new HttpLimiter({} as never, { rules: [] }), { code: "ERR_RL_USAGE" });
  // The same limit under one name in several rules is one bucket on purpose.
  rateLimit(limiter, {
    rules: [
      { name: "shared", path: "/a/", limit: w, key: ipKey() },
      { name: "shared", path: "/b/", limit: w, key: ipKey() },
    ],
  });
});
