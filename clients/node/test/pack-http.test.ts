// The HTTP entry points as users get them: `npm pack`, installed into an empty project, each
// of redis-rl/http, redis-rl/express, redis-rl/fastify and redis-rl/express-rate-limit loaded
// by import and by require (without express or fastify installed: they are the app's), and
// the express and store types (req.rateLimit included) for an ESM and a CommonJS TypeScript
// consumer.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, symlinkSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = fileURLToPath(new URL("../..", import.meta.url)); // build/test -> clients/node

test("the HTTP subpaths install from the packed package and load by import and require", () => {
  assert.ok(existsSync(join(pkgDir, "dist", "esm", "http", "express.js")), "run npm run build first");
  const dir = mkdtempSync(join(tmpdir(), "redis-rl-pack-http-"));
  try {
    const out = execFileSync("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", dir], {
      cwd: pkgDir,
      encoding: "utf8",
    });
    const info = JSON.parse(out) as { filename: string }[];
    const app = join(dir, "app");
    execFileSync("mkdir", [app]);
    writeFileSync(
      join(app, "package.json"),
      JSON.stringify({ name: "app", version: "1.0.0", private: true }),
    );
    // --prefer-offline, not --offline: `npm ci` caches tarballs but not the registry's package
    // documents, so on a fresh machine resolving fastify-plugin's range needs the registry.
    execFileSync(
      "npm",
      ["install", "--prefer-offline", "--no-audit", "--no-fund", join(dir, info[0]!.filename)],
      {
        cwd: app,
        stdio: "pipe",
      },
    );
    const check = `
      const names = [typeof http.HttpLimiter, typeof http.ipKey, typeof ex.rateLimit, typeof ex.headerKey,
        typeof fy.redisRateLimit, typeof fy.default, typeof st.RedisRlStore, typeof st.default];
      if (names.some((n) => n !== "function")) throw new Error(names.join());
      const limiter = new core.RateLimiter({ sendCommand: async () => null });
      try { ex.rateLimit(limiter, { rules: [], windowMs: 1 }); throw new Error("accepted"); }
      catch (e) { if (!(e instanceof core.RateLimitConfigError) || e.code !== "ERR_RL_UNKNOWN_OPTION") throw e; }
      const store = new st.RedisRlStore({ limiter });
      console.log(store.prefix, http.normalizePath("/a/../b//c/"), http.identityKey("api", "ip", "::1"));`;
    writeFileSync(
      join(app, "esm.mjs"),
      `import * as core from "redis-rl"; import * as http from "redis-rl/http"; import * as ex from "redis-rl/express";
       import * as fy from "redis-rl/fastify"; import * as st from "redis-rl/express-rate-limit";\n${check}\n`,
    );
    writeFileSync(
      join(app, "cjs.cjs"),
      `const core = require("redis-rl"), http = require("redis-rl/http"), ex = require("redis-rl/express"),
       fy = require("redis-rl/fastify"), st = require("redis-rl/express-rate-limit");\n${check}\n`,
    );
    const esm = execFileSync("node", ["esm.mjs"], { cwd: app, encoding: "utf8" });
    assert.equal(esm, "rl: /b/c api:{ip:::1}\n");
    assert.equal(execFileSync("node", ["cjs.cjs"], { cwd: app, encoding: "utf8" }), esm);
    const ts = `export function f(limiter: core.RateLimiter) {
        const mw: ex.RateLimitMiddleware = ex.rateLimit(limiter, {
          rules: [{ name: "api", limit: "10/minute", key: ex.ipKey() }],
          handler: (_req, res, _next, denial: ex.Denial) => res.end(denial.body),
        });
        const store = new st.RedisRlStore({ limiter, prefix: "x:" });
        const app = express();
        app.use(mw);
        // req.rateLimit is typed by the package's Express.Request augmentation.
        app.get("/", (req, res) => {
          const remaining: number | undefined = req.rateLimit?.remaining;
          const reset: Date | undefined = req.rateLimit?.resetTime;
          res.json({ remaining, reset, allowed: req.rateLimit?.decision.allowed });
        });
        return [app, store.localKeys] as const;
      }\n`;
    writeFileSync(
      join(app, "esm.mts"),
      `import * as core from "redis-rl"; import * as ex from "redis-rl/express"; import * as st from "redis-rl/express-rate-limit";\nimport express from "express";\n${ts}`,
    );
    writeFileSync(
      join(app, "cjs.cts"),
      `import core = require("redis-rl"); import ex = require("redis-rl/express"); import st = require("redis-rl/express-rate-limit");\nimport express = require("express");\n${ts}`,
    );
    // The app's express types (a type-only check: express itself is not installed), from
    // this package's own devDependencies.
    symlinkSync(join(pkgDir, "node_modules", "@types"), join(app, "node_modules", "@types"), "dir");
    const tsc = join(pkgDir, "node_modules", "typescript", "bin", "tsc");
    const flags = [
      "--noEmit",
      "--strict",
      "--module",
      "nodenext",
      "--moduleResolution",
      "nodenext",
      "--target",
      "es2022",
    ];
    flags.push("--typeRoots", join(pkgDir, "node_modules", "@types"), "--types", "node");
    try {
      execFileSync("node", [tsc, ...flags, "esm.mts", "cjs.cts"], { cwd: app, encoding: "utf8" });
    } catch (e) {
      assert.fail(String((e as { stdout?: string }).stdout));
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
