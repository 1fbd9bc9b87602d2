// The README's HTTP examples run as users run them: each ```js block of the
// "## HTTP: express, fastify, express-rate-limit" section as its own ES module inside the
// package (so "redis-rl/express" resolves to the built package), its server on a free port
// against a real redis-server, asked over HTTP, stopped by its PID.
import { describe, test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { readFileSync, writeFileSync, rmSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Server, freePort } from "./harness.js";
import { send, until } from "./http-helpers.js";

const pkg = fileURLToPath(new URL("../..", import.meta.url)); // build/test -> clients/node
const HEADING = "## HTTP: express, fastify, express-rate-limit";

function examples(): string[] {
  const text = readFileSync(`${pkg}README.md`, "utf8");
  const start = text.indexOf(HEADING);
  assert.ok(start >= 0, "the README has the HTTP section");
  const next = text.indexOf("\n## ", start + HEADING.length);
  const section = text.slice(start, next < 0 ? undefined : next);
  return [...section.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

describe("README: the HTTP examples", () => {
  let redis: Server;
  before(async () => {
    redis = await new Server(true).start();
  });
  after(async () => redis.remove());

  const blocks = examples();
  test("the section has its three examples", () => assert.equal(blocks.length, 3));

  // A TypeScript user pastes them too: the express and fastify examples type-check under
  // --strict as ES modules against the built package's types. (The third is
  // express-rate-limit's own req.rateLimit, which that package types, as the README says.)
  test("the express and fastify examples type-check (tsc --strict)", () => {
    const dir = `${pkg}build/readme-ts`;
    mkdirSync(dir, { recursive: true });
    const files = blocks.slice(0, 2).map((code, i) => {
      const file = join(dir, `example-${i + 1}.mts`);
      writeFileSync(file, code);
      return file;
    });
    const tsc = join(pkg, "node_modules", "typescript", "bin", "tsc");
    const flags = ["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext"];
    // skipLibCheck: ioredis 6's own declarations import an untyped module (as the README says).
    flags.push("--target", "es2022", "--types", "node", "--skipLibCheck");
    try {
      execFileSync("node", [tsc, ...flags, ...files], { cwd: pkg, encoding: "utf8" });
    } catch (e) {
      assert.fail(String((e as { stdout?: string }).stdout));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  blocks.forEach((code, i) => {
    test(`example ${i + 1} serves /api/hello with the RateLimit fields`, async () => {
      const file = `${pkg}build/readme-http-${i + 1}.mjs`;
      writeFileSync(file, code);
      const port = await freePort();
      let child: ChildProcess | undefined;
      let stderr = "";
      try {
        child = spawn(process.execPath, [file], {
          env: { ...process.env, PORT: String(port), REDIS_URL: `redis://127.0.0.1:${redis.port}` },
          stdio: ["ignore", "ignore", "pipe"],
        });
        child.stderr!.on("data", (d) => (stderr += String(d)));
        assert.ok(
          await until(
            async () => (await send(port, "/api/hello").catch(() => undefined)) !== undefined,
            10_000,
          ),
          `the example did not answer: ${stderr}`,
        );
        const r = await send(port, "/api/hello");
        assert.equal(r.status, 200, r.text + stderr);
        assert.ok(r.headers["ratelimit"], JSON.stringify(r.headers));
        assert.ok(r.headers["ratelimit-policy"], JSON.stringify(r.headers));
        assert.equal(typeof Object.values(r.body ?? {})[0], "number", r.text);
      } finally {
        child?.kill("SIGKILL");
        rmSync(file, { force: true });
      }
    });
  });
});
