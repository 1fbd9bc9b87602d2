// Batching's trade-off, measured (docs/clients.md#batching-optional): one process checking one
// GCRA key out of its reach (burst 1000 at 100,000/s) for BENCH_SECONDS (3) each, without
// batching and with batch 10: Redis calls per admission and decisions per second; then a key
// far above its limit (burst 20 at 100/s): admitted against what the limit allows. Starts its
// own redis-server with the module (RL_MODULE, default the repository's release build) on a
// free loopback port. Run after `npm run build`: node scripts/bench-batch.mjs
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import { Redis } from "ioredis";
import { RateLimiter, GCRA } from "../dist/esm/index.js";

const root = fileURLToPath(new URL("../../..", import.meta.url));
const module = process.env.RL_MODULE || join(root, "target", "release", "libredis_rl.so");
const seconds = Number(process.env.BENCH_SECONDS || 3);
const port = await new Promise((resolve) => {
  const s = createServer().listen(0, "127.0.0.1", () => {
    const p = s.address().port;
    s.close(() => resolve(p));
  });
});
const server = spawn(
  "redis-server",
  ["--port", String(port), "--save", "", "--appendonly", "no", "--loadmodule", module],
  {
    stdio: "ignore",
  },
);
const redis = new Redis({ port, host: "127.0.0.1", retryStrategy: (n) => (n > 100 ? null : 20) });
redis.on("error", () => {});
try {
  await new Promise((resolve, reject) => {
    redis.once("ready", resolve);
    server.once("exit", (code) =>
      reject(new Error(`redis-server exited (${code}): is the module at ${module}?`)),
    );
  });
  for (const [name, limit] of [
    ["out of reach (burst 1000 at 100,000/s)", new GCRA({ burst: 1000, rate: 100_000, periodMs: 1000 })],
    ["far above the limit (burst 20 at 100/s)", new GCRA({ burst: 20, rate: 100, periodMs: 1000 })],
  ]) {
    for (const batch of [1, 10]) {
      const limiter = new RateLimiter({ client: redis, batch, prefix: `bench${batch}:${Date.now()}:` });
      await limiter.resolvedMode();
      const start = performance.now();
      let decisions = 0;
      let admitted = 0;
      while (performance.now() - start < seconds * 1000) {
        if ((await limiter.check("k", limit)).allowed) admitted++;
        decisions++;
      }
      const elapsed = (performance.now() - start) / 1000;
      await limiter.close();
      const c = limiter.counters;
      const allows = Math.floor(Number(limit.burst) + (elapsed * Number(limit.rate) * 1000) / limit.periodMs);
      console.log(
        `${name}, batch ${batch}: ${Math.round(decisions / elapsed)} decisions/s, ` +
          `${(c.redisCalls / Math.max(1, admitted)).toFixed(2)} Redis calls per admission, ` +
          `${admitted} admitted of ${allows} allowed (${c.allowedLocally} from batch units, ${c.deniedLocally} denied locally)`,
      );
    }
  }
} finally {
  redis.disconnect();
  server.kill("SIGKILL");
}
