// The packed package as users get it: `npm pack`, installed into an empty project, loaded by
// `import` and by `require`, with the Lua fallback inside (from the repository's one copy).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = fileURLToPath(new URL("../..", import.meta.url)); // build/test -> clients/node
const repoLua = join(pkgDir, "..", "..", "scripts", "lua", "redis_rl.lua");

test("npm pack installs into an empty project and loads by import and require", () => {
  assert.ok(existsSync(join(pkgDir, "dist", "esm", "index.js")), "run npm run build first");
  const dir = mkdtempSync(join(tmpdir(), "redis-rl-pack-"));
  try {
    const out = execFileSync("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", dir], {
      cwd: pkgDir,
      encoding: "utf8",
    });
    const info = JSON.parse(out) as { filename: string; files: { path: string }[] }[];
    const files = info[0]!.files.map((f) => f.path);
    assert.ok(files.includes("dist/redis_rl.lua"));
    assert.ok(!files.some((f) => f.startsWith("src/") || f.startsWith("test/")), files.join(" "));
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
    const check = `const v = new m.GCRA({ burst: 5, rate: 5, periodMs: 1000 }).args().join(" ");
      if (v !== "5 5 1") throw new Error(v);
      if (m.LIBRARY_VERSION === "" || m.LUA_LIBRARY_TEXT.length < 1000) throw new Error("no library");
      try { new m.Window({ limit: 0, windowMs: 1000 }); throw new Error("accepted"); }
      catch (e) { if (!(e instanceof m.RateLimitConfigError) || e.code !== "ERR_RL_INVALID_LIMIT") throw e; }
      console.log(typeof m.RateLimiter, m.LIBRARY_VERSION);`;
    writeFileSync(join(app, "esm.mjs"), `import * as m from "redis-rl";\n${check}\n`);
    writeFileSync(join(app, "cjs.cjs"), `const m = require("redis-rl");\n${check}\n`);
    const esm = execFileSync("node", ["esm.mjs"], { cwd: app, encoding: "utf8" });
    const cjs = execFileSync("node", ["cjs.cjs"], { cwd: app, encoding: "utf8" });
    assert.match(esm, /^function \d+\.\d+\.\d+\n$/);
    assert.equal(cjs, esm);
    const lua = execFileSync(
      "node",
      ["-p", "require('fs').readFileSync(require.resolve('redis-rl/redis_rl.lua'),'utf8')"],
      {
        cwd: app,
        encoding: "utf8",
        maxBuffer: 1 << 24,
      },
    );
    assert.equal(lua, readFileSync(repoLua, "utf8") + "\n");
    // The types, for an ESM and a CommonJS TypeScript consumer (NodeNext resolution).
    const ts = `const limit: m.Limit = new m.GCRA({ burst: 1, rate: 1, periodMs: 1000 });
      export async function f(limiter: m.RateLimiter): Promise<number> {
        const d: m.Decision = await limiter.check("k", limit, { cost: 1 });
        return d.never ? Infinity : d.retryAfterMs;
      }\n`;
    writeFileSync(join(app, "esm.mts"), `import * as m from "redis-rl";\n${ts}`);
    writeFileSync(join(app, "cjs.cts"), `import m = require("redis-rl");\n${ts}`);
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
    execFileSync("node", [tsc, ...flags, "esm.mts", "cjs.cts"], { cwd: app, stdio: "pipe" });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
