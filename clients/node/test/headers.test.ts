// The HTTP fields of a decision, byte for byte as the Go package writes them
// (clients/go/unit_test.go TestHeaders; docs/reference.md#r-reply-4). No server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { GCRA, Window, Lease, decisionHeaders, type Decision } from "../src/index.js";
import { makeDecision } from "../src/decision.js";

test("decision headers", () => {
  const g = new GCRA({ burst: 10, rate: 3, periodMs: 1000 });
  const d = makeDecision({
    allowed: true,
    limit: 10,
    remaining: 3,
    resetAfterMs: 7200,
    spec: g,
    source: "module",
  });
  assert.deepEqual(decisionHeaders(d, { policyName: "api" }), {
    "RateLimit-Policy": '"api";q=10;w=4',
    RateLimit: '"api";r=3;t=8',
  });
  const named = new GCRA({ burst: 10, rate: 3, periodMs: 1000, name: "named" });
  const denied = makeDecision({
    allowed: false,
    limit: 10,
    retryAfterMs: 1500,
    resetAfterMs: 10_000,
    spec: named,
    source: "module",
  });
  assert.deepEqual(decisionHeaders(denied, { xHeaders: true }), {
    "Retry-After": "2",
    "RateLimit-Policy": '"named";q=10;w=4',
    RateLimit: '"named";r=0;t=10',
    "X-RateLimit-Limit": "10",
    "X-RateLimit-Remaining": "0",
    "X-RateLimit-Reset": "10",
  });
  // A denial's Retry-After is at least 1; never has none; blind has only Retry-After.
  const short = decisionHeaders(makeDecision({ allowed: false, retryAfterMs: 1, source: "module" }));
  assert.equal(short["Retry-After"], "1");
  assert.equal(short["RateLimit"], '"default";r=0;t=0');
  const never = makeDecision({
    allowed: false,
    never: true,
    retryAfterMs: Infinity,
    limit: 3,
    source: "module",
  });
  assert.equal(decisionHeaders(never)["Retry-After"], undefined);
  const blind = makeDecision({
    allowed: false,
    retryAfterMs: 1000,
    blind: true,
    degraded: true,
    limit: 5,
    spec: g,
    source: "local",
  });
  assert.deepEqual(decisionHeaders(blind, { policyName: "x" }), { "Retry-After": "1" });
  const lease = makeDecision({
    allowed: true,
    limit: 2,
    remaining: 1,
    spec: new Lease({ limit: 2, leaseMs: 60_000 }),
    source: "module",
  });
  assert.equal(
    decisionHeaders(lease, { policyName: "jobs" })["RateLimit-Policy"],
    '"jobs";q=2;qu="concurrent-requests"',
  );
  const per: Decision[] = [
    makeDecision({
      key: "p:a",
      allowed: true,
      limit: 2,
      remaining: 1,
      resetAfterMs: 1000,
      spec: new Window({ limit: 2, windowMs: 60_000, algorithm: "FIXED" }),
      source: "module",
    }),
    makeDecision({
      key: "p:b",
      allowed: true,
      limit: 5,
      remaining: 4,
      resetAfterMs: 1000,
      spec: new Window({ limit: 5, windowMs: 3_600_000, algorithm: "LOG", name: "hourly" }),
      source: "module",
    }),
  ];
  const combined = makeDecision({ allowed: true, perKey: per, source: "module" });
  const h = decisionHeaders(combined, { names: { "p:a": "minute" } });
  assert.equal(h["RateLimit-Policy"], '"minute";q=2;w=60, "hourly";q=5;w=3600');
  assert.equal(h["RateLimit"], '"minute";r=1;t=1, "hourly";r=4;t=1');
  // The longest durations do not overflow.
  const max = makeDecision({
    allowed: false,
    limit: 1,
    retryAfterMs: 9_223_372_036_854_775_807,
    source: "module",
  });
  assert.equal(decisionHeaders(max)["Retry-After"], "9223372036854776");
});
