// The Node package's fast-path table, as clients/go/bench/fastpath and the Python and Rust
// packages measure theirs (docs/clients.md#local-deny-cache, docs/clients.md#batching-optional):
// N processes (this script again, with --worker) each run one RateLimiter on ioredis in a
// tight loop (one decision at a time) on one GCRA key, three ways: no fast path (denyCache
// false), the deny cache (the default), the deny cache with batching. Per configuration:
// requests admitted against what the limit allows over the run (burst + rate × elapsed, +1),
// Redis calls per admitted request (the limiter's redisCalls, batch refunds at close()
// included), decisions per second per process.
//
//     node bench/fastpath.mjs [--procs 4] [--seconds 3] [--batch 10]    (after npm run build)
//
// It starts its own redis-server with the module ($RL_MODULE, default the repository's
// target/release/libredis_rl.so; $REDIS_SERVER names the binary) on a free loopback port.
// BENCH_QUICK=1 makes it 1 s per configuration. The figures are printed, never asserted,
// except that it exits 1 when a configuration admitted more than the limit allows.
import { cpus } from "node:os";
import { parseArgs } from "node:util";
import { Redis } from "ioredis";
import { RateLimiter, GCRA } from "../dist/esm/index.js";
import { QUICK, sleep, startChild, startRedis, stopChild, thousands } from "./support.mjs";

// (burst, rate per second): a low limit, a higher one, and one the processes cannot reach.
const SCENARIOS = [
  [20, 100],
  [200, 2000],
  [1000, 100_000],
];

async function worker([kind, port, key, burst, rate, batch, startAt, seconds]) {
  const client = new Redis({ port: Number(port), host: "127.0.0.1" });
  const options = { client, timeoutMs: 2000, onError: "raise" };
  if (kind === "none") options.denyCache = false;
  if (kind === "batch") Object.assign(options, { batch: Number(batch), batchHoldMs: 100 });
  const limiter = new RateLimiter(options);
  const limit = new GCRA({ burst: Number(burst), rate: Number(rate), periodMs: 1000 });
  await limiter.check(`warm-up:${key}`, limit); // connect and detect before the start
  const before = limiter.counters;
  // Announce readiness, then start at the agreed instant.
  process.stdout.write("{}\n");
  await sleep(Math.max(0, Number(startAt) - Date.now()));
  const t0 = Date.now();
  const end = t0 + Number(seconds) * 1000;
  let decisions = 0;
  let admitted = 0;
  while (Date.now() < end) {
    if ((await limiter.check(key, limit)).allowed) admitted++;
    decisions++;
  }
  const t1 = Date.now();
  await limiter.close(); // gives back held batch units
  const after = limiter.counters;
  const d = (name) => after[name] - before[name];
  const figures = {
    t0,
    t1,
    decisions,
    admitted,
    calls: d("redisCalls"),
    deniedLocally: d("deniedLocally"),
    allowedLocally: d("allowedLocally"),
    refunded: d("refunded"),
  };
  client.disconnect();
  // The figures: the second stdout line.
  process.stdout.write(JSON.stringify(figures) + "\n");
}

let keyN = 0;

/** Runs procs workers of kind on a fresh key at one instant and returns their figures. */
async function run(port, kind, procs, burst, rate, batch, seconds) {
  const key = `bench:${process.pid}:${++keyN}`;
  const startAt = Date.now() + 1500;
  const self = new URL(import.meta.url).pathname;
  const args = [kind, port, key, burst, rate, batch, startAt, seconds].map(String);
  const children = await Promise.all(
    Array.from({ length: procs }, () => startChild(self, ["--worker", ...args])),
  );
  const results = await Promise.all(
    children.map(
      ({ child, rest }) =>
        new Promise((resolve, reject) => {
          let out = rest;
          const timer = setTimeout(
            () => reject(new Error(`${kind} worker: no result`)),
            seconds * 1000 + 60_000,
          );
          child.stdout.on("data", (d) => (out += d));
          child.once("exit", (code) => {
            clearTimeout(timer);
            const line = out.trim().split("\n").pop();
            if (code !== 0 || !line) reject(new Error(`${kind} worker exited ${code}`));
            else resolve(JSON.parse(line));
          });
        }),
    ),
  );
  await Promise.all(children.map(({ child }) => stopChild(child)));
  return results;
}

function sum(fs) {
  const t = { t0: Math.min(...fs.map((f) => f.t0)), t1: Math.max(...fs.map((f) => f.t1)), perProc: 0 };
  for (const name of ["admitted", "calls", "deniedLocally", "allowedLocally", "refunded"]) {
    t[name] = fs.reduce((a, f) => a + f[name], 0);
  }
  for (const f of fs) t.perProc += f.decisions / ((f.t1 - f.t0) / 1000) / fs.length;
  return t;
}

async function main() {
  const { values } = parseArgs({
    options: {
      procs: { type: "string", default: "4" },
      seconds: { type: "string", default: QUICK ? "1" : "3" },
      batch: { type: "string", default: "10" },
    },
  });
  const procs = Number(values.procs);
  const seconds = Number(values.seconds);
  const batch = Number(values.batch);
  const redis = await startRedis();
  let over = false;
  try {
    console.log(
      `Node package (clients/node): ${procs} processes on one GCRA key for ${seconds} s each configuration, ` +
        `each process one RateLimiter on ioredis, one decision at a time in a tight loop; redis-server with ` +
        `the module on loopback; ${cpus().length} CPUs shared by everything.\n`,
    );
    console.log(
      "| limit | configuration | admitted / limit allows | Redis calls per admitted | decisions/s per process | local denials | local admissions | refunded |",
    );
    console.log("|---|---|---|---|---|---|---|---|");
    const names = { none: "no fast path", deny: "deny cache", batch: `deny cache + batch ${batch}` };
    for (const [burst, rate] of SCENARIOS) {
      for (const kind of ["none", "deny", "batch"]) {
        const t = sum(await run(redis.port, kind, procs, burst, rate, batch, seconds));
        const allows = burst + Math.floor(((t.t1 - t.t0) / 1000) * rate) + 1;
        over ||= t.admitted > allows;
        const perAdmitted = t.admitted > 0 ? (t.calls / t.admitted).toFixed(2) : "∞";
        console.log(
          `| burst ${burst}, ${thousands(rate)}/s | ${names[kind]} | ${t.admitted} / ${allows} | ${perAdmitted} | ` +
            `${thousands(t.perProc)} | ${thousands(t.deniedLocally)} | ${thousands(t.allowedLocally)} | ${t.refunded} |`,
        );
      }
    }
  } finally {
    await redis.stop();
  }
  if (over) {
    console.error("FAILED: a configuration admitted more than the limit allows");
    process.exit(1);
  }
}

if (process.argv[2] === "--worker") {
  await worker(process.argv.slice(3));
} else {
  await main();
}
