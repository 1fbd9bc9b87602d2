// The wire and its rules without a server: frames, the library plan, the settings an upgrade
// keeps, slots, outage classification, RL.ALL's combination (clients/go/unit_test.go's cases).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  frame,
  planFor,
  configuredCode,
  isUnavailable,
  isRefused,
  isMissingFunction,
} from "../src/protocol.js";
import { keySlot, slotGroups } from "../src/slots.js";
import { combine, makeDecision, fromReply } from "../src/decision.js";
import { RedisReplyError, RedisTimeoutError, RateLimitConfigError } from "../src/errors.js";
import { normalizeError } from "../src/transport.js";
import { LUA_LIBRARY_TEXT, LIBRARY_VERSION } from "../src/index.js";
import { SCRIPT_SHA, SCRIPT_TEXT } from "../src/lua.js";
import { createHash } from "node:crypto";

test("frames: the module's command or the fallback's call with the same arguments", () => {
  assert.deepEqual(frame("module", "functions", "", "gcra", ["k"], ["1", "2", "3"]), [
    "RL.GCRA",
    "k",
    "1",
    "2",
    "3",
  ]);
  assert.deepEqual(frame("module", "functions", "", "all", ["a", "b"], ["X"]), [
    "RL.ALL",
    "2",
    "a",
    "b",
    "X",
  ]);
  assert.deepEqual(frame("fallback", "functions", "", "window", ["k"], ["1"]), [
    "FCALL",
    "rl_window",
    "1",
    "k",
    "1",
  ]);
  assert.deepEqual(frame("fallback", "sha", "abc", "lease", ["k"], ["1"]), [
    "EVALSHA",
    "abc",
    "1",
    "k",
    "rl_lease",
    "1",
  ]);
  const text = frame("fallback", "text", "", "refund", ["k"], ["2"]);
  assert.equal(text[0], "EVAL");
  assert.equal(text[1], SCRIPT_TEXT);
  assert.deepEqual(text.slice(2), ["1", "k", "rl_refund", "2"]);
  assert.ok(!SCRIPT_TEXT.startsWith("#!lua"));
  assert.equal(SCRIPT_SHA, createHash("sha1").update(SCRIPT_TEXT).digest("hex"));
});

test("a client never replaces a newer library with an older one", () => {
  assert.equal(planFor("", false, "1.3.0"), "load");
  assert.equal(planFor("1.3.0", true, "1.3.0"), "keep");
  assert.equal(planFor("1.2.9", true, "1.3.0"), "replace");
  assert.equal(planFor("", true, "1.3.0"), "replace");
  assert.equal(planFor("1.10.0", true, "1.9.0"), "newer");
  assert.equal(planFor("1.3.0.1", true, "1.3.0"), "newer");
  assert.equal(planFor("garbage", true, "1.3.0"), "replace");
});

test("an upgrade keeps the operator's settings", () => {
  const theirs = LUA_LIBRARY_TEXT.replace("local LOG_MAX_LIMIT = 100000\n", "local LOG_MAX_LIMIT = 5000\n");
  const code = configuredCode(LUA_LIBRARY_TEXT, theirs);
  assert.ok(code.includes("local LOG_MAX_LIMIT = 5000\n"));
  assert.ok(code.includes("local ALL_MAX_KEYS = 64\n"));
  assert.ok(code.includes(`local VERSION = '${LIBRARY_VERSION}'`));
});

test("cluster slots by hash tag", () => {
  assert.equal(keySlot("123456789"), 0x31c3 % 16384);
  assert.equal(keySlot("foo"), 12182);
  assert.equal(keySlot("{user1000}.following"), keySlot("user1000"));
  assert.equal(keySlot("foo{}{bar}"), keySlot("foo{}{bar}"));
  assert.equal(keySlot("{}x"), keySlot("{}x"));
  assert.deepEqual(slotGroups(["{a}1", "{b}1", "{a}2"]), [[0, 2], [1]]);
});

test("outages and misuses are told apart", () => {
  const reply = (t: string) => new RedisReplyError(t);
  for (const t of [
    "OOM command not allowed",
    "LOADING x",
    "CLUSTERDOWN x",
    "TRYAGAIN x",
    "READONLY x",
    "MASTERDOWN x",
  ]) {
    assert.equal(isUnavailable(reply(t)), true, t);
  }
  for (const t of ["WRONGTYPE x", "ERR burst must be a positive integer", "NOPERM x", "CROSSSLOT x"]) {
    assert.equal(isUnavailable(reply(t)), false, t);
  }
  assert.equal(isUnavailable(new RedisTimeoutError(5)), true);
  assert.equal(
    isUnavailable(Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" })),
    true,
  );
  assert.equal(isUnavailable(new Error("The client is closed")), false);
  assert.equal(isUnavailable(new RateLimitConfigError("ERR_RL_USAGE", "x")), false);
  assert.equal(isRefused(reply("ERR unknown command 'FCALL', with args beginning with:")), true);
  assert.equal(isRefused(reply("NOPERM User x has no permissions to run the 'function|load' command")), true);
  assert.equal(isRefused(reply("NOPERM No permissions to access a key")), false);
  assert.equal(isMissingFunction(reply("ERR Function not found")), true);
  class ReplyError extends Error {}
  class ErrorReply extends Error {}
  assert.ok(normalizeError(new ReplyError("WRONGTYPE x")) instanceof RedisReplyError);
  assert.ok(normalizeError(new ErrorReply("WRONGTYPE x")) instanceof RedisReplyError);
  const plain = new Error("socket hang up");
  assert.equal(normalizeError(plain), plain);
});

test("replies: -1 is a zero wait when allowed and never when denied", () => {
  const allowed = fromReply([1, 5, 4, -1, 200], undefined, "k", "module", false);
  assert.equal(allowed.retryAfterMs, 0);
  assert.equal(allowed.never, false);
  const never = fromReply([0, 5, 5, -1, 0], undefined, "k", "module", false);
  assert.equal(never.never, true);
  assert.equal(never.retryAfterMs, Infinity);
  const reserved = fromReply([1, 5, 0, 150, 900], undefined, "k", "fallback", true);
  assert.equal(reserved.retryAfterMs, 150);
});

test("RL.ALL's combination binds on the fewest further calls of the same shape", () => {
  const d = (remaining: number, allowed = true, retryAfterMs = 0) =>
    makeDecision({ allowed, remaining, limit: 1000, retryAfterMs, source: "module" });
  // 599 requests left at cost 1, 1000 tokens at cost 1200: bound by tokens.
  let c = combine([d(599), d(1000, false, 30)], [1n, 1200n]);
  assert.equal(c.remaining, 1000);
  assert.equal(c.allowed, false);
  assert.equal(c.retryAfterMs, 30);
  // A cost-0 entry takes no part unless every entry is at cost 0.
  c = combine([d(1), d(50)], [0n, 1n]);
  assert.equal(c.remaining, 50);
  c = combine([d(1), d(50)], [0n, 0n]);
  assert.equal(c.remaining, 1);
  const never = combine(
    [
      d(5, false, 10),
      makeDecision({ allowed: false, never: true, retryAfterMs: Infinity, source: "module" }),
    ],
    [1n, 1n],
  );
  assert.equal(never.never, true);
  assert.equal(never.retryAfterMs, Infinity);
});
