// README.md's quick start, run as written (its server moved to the test's port) against a
// server with the module and one without it, importing the package by its name.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Server } from "./harness.js";

const pkgDir = fileURLToPath(new URL("../..", import.meta.url)); // build/test -> clients/node
const servers = [new Server(true), new Server(false)];
before(async () => {
  for (const s of servers) await s.start();
});
after(async () => {
  for (const s of servers) await s.remove();
});

test("the README's quick start runs as written", () => {
  const readme = readFileSync(join(pkgDir, "README.md"), "utf8");
  const block = /```js\n([\s\S]*?)```/.exec(readme)![1]!;
  assert.match(block, /new Redis\(\)/);
  for (const [s, source] of [
    [servers[0]!, "module"],
    [servers[1]!, "fallback"],
  ] as const) {
    const file = join(pkgDir, "build", `readme-quick-${source}.mjs`);
    writeFileSync(file, block.replace("new Redis()", `new Redis({ port: ${s.port} })`));
    try {
      const out = execFileSync("node", [file], { cwd: pkgDir, encoding: "utf8" });
      assert.equal(out, `allowed, 9 left of 10 from the ${source}\n`);
    } finally {
      rmSync(file, { force: true });
    }
  }
});
