// The same express app (bench/app.mjs) limited by express-rate-limit with rate-limit-redis, by
// rate-limiter-flexible, by express-rate-limit with this package's RedisRlStore, by this
// package's middleware on the module and on its Lua library, and by nothing, each app in a
// process of its own on one redis-server with the module (on loopback), all on ioredis and a
// fixed window on the client's IP:
//
// 1. Redis calls per admitted request (the commands each app's ioredis client sent), the
//    p50/p99 of one GET (one request at a time, keep-alive; the rows timed in turns, a tenth
//    of the samples each, so that a busy moment falls on every row alike), as ratios to the
//    app without a limiter, and the app process's CPU time per request (process.cpuUsage).
// 2. Exactness: two processes of each app on one limit of 50 per hour, 8 concurrent
//    connections × 40 requests to each: requests admitted (200) against 50.
// 3. Answers while Redis is paused (SIGSTOP: connections stay open, nothing answers) and while
//    it is stopped (killed): each app's status codes and the slowest answer of four requests
//    (a 10 s deadline each, 5 s with BENCH_QUICK), then the first answer once Redis is back
//    (resumed; restarted empty, as after a failover, where a script cache is gone too).
//
//     node bench/sidebyside.mjs [--samples 5000]    (after npm run build)
//
// Printed, never asserted, except that it exits 1 when this package's middleware or store
// admitted more than 50 in part 2.
import { parseArgs } from "node:util";
import { cpus } from "node:os";
import { QUICK, get, keepAlive, percentile, startChild, startRedis, stopChild, us } from "./support.mjs";

const KINDS = [
  ["none", "no limiter"],
  ["rate-limit-redis", "express-rate-limit 8 + rate-limit-redis 5"],
  ["flexible", "rate-limiter-flexible 11 (RateLimiterRedis)"],
  ["store", "express-rate-limit 8 + redis-rl's RedisRlStore"],
  ["redis-rl", "redis-rl express middleware, module"],
  ["redis-rl-lua", "redis-rl express middleware, Lua library"],
];
const OURS = new Set(["store", "redis-rl", "redis-rl-lua"]);
const APP = new URL("./app.mjs", import.meta.url).pathname;
const HOUR = 3_600_000;

let prefixN = 0;
async function startApp(kind, redisPort, limit, windowMs, prefix = `sbs${++prefixN}:`) {
  const { child, ready } = await startChild(APP, [
    kind,
    String(redisPort),
    String(limit),
    String(windowMs),
    prefix,
  ]);
  return { kind, child, port: ready.port };
}

/** The app's Redis commands sent and CPU µs used so far. */
async function usage(app) {
  const r = await get(undefined, app.port, "/calls");
  if (r.status !== 200) throw new Error(`${app.kind} /calls: ${r.status} ${r.error ?? r.body}`);
  return JSON.parse(r.body);
}

async function latency(redisPort, samples) {
  const apps = [];
  for (const [kind] of KINDS) apps.push(await startApp(kind, redisPort, 1e9, HOUR));
  try {
    const rows = apps.map((app) => ({ app, agent: keepAlive(1), ms: [] }));
    for (let turn = 0; turn < 11; turn++) {
      for (const row of rows) {
        if (turn === 1) row.before = await usage(row.app);
        for (let i = 0; i < Math.max(1, samples / 10); i++) {
          const r = await get(row.agent, row.app.port, "/");
          if (r.status !== 200) throw new Error(`${row.app.kind}: ${r.status} ${r.error ?? r.body}`);
          if (turn > 0) row.ms.push(r.ms);
        }
      }
    }
    for (const row of rows) {
      const after = await usage(row.app);
      row.perRequest = (after.calls - row.before.calls) / row.ms.length;
      // The /calls requests themselves are a negligible part (two of thousands).
      row.cpuUs = (after.cpuUs - row.before.cpuUs) / row.ms.length;
      row.ms.sort((a, b) => a - b);
      row.p50 = percentile(row.ms, 50);
      row.p99 = percentile(row.ms, 99);
    }
    return rows;
  } finally {
    await Promise.all(apps.map((a) => stopChild(a.child)));
  }
}

async function exactness(redisPort, kind) {
  const prefix = `exact${++prefixN}:`;
  const apps = [
    await startApp(kind, redisPort, 50, HOUR, prefix),
    await startApp(kind, redisPort, 50, HOUR, prefix),
  ];
  try {
    const t0 = Date.now();
    const statuses = await Promise.all(
      apps.flatMap((app) =>
        Array.from({ length: 8 }, async () => {
          const agent = keepAlive(1);
          const out = [];
          for (let i = 0; i < 40; i++) out.push((await get(agent, app.port, "/")).status);
          return out;
        }),
      ),
    );
    const t1 = Date.now();
    const flat = statuses.flat();
    // FIXED windows aligned to the epoch (RL.WINDOW, RedisRlStore) allow 50 in each window
    // the run touched; the others' windows start at the first hit.
    const windows = OURS.has(kind) ? Math.floor(t1 / HOUR) - Math.floor(t0 / HOUR) + 1 : 1;
    return {
      admitted: flat.filter((s) => s === 200).length,
      denied: flat.filter((s) => s === 429).length,
      other: flat.filter((s) => s !== 200 && s !== 429).length,
      allows: 50 * windows,
    };
  } finally {
    await Promise.all(apps.map((a) => stopChild(a.child)));
  }
}

/** Four GETs one after another: their statuses and the slowest. */
async function during(app, deadlineMs) {
  const agent = keepAlive(1);
  const statuses = [];
  let slowest = 0;
  for (let i = 0; i < 4; i++) {
    const r = await get(agent, app.port, "/", deadlineMs);
    statuses.push(r.status === 0 ? "none" : String(r.status));
    slowest = Math.max(slowest, r.ms);
  }
  agent.destroy();
  return { statuses, slowest };
}

/** GETs until one is answered 200 (30 s at most): the first answer and how long until a 200. */
async function recovery(app) {
  const t0 = performance.now();
  const agent = keepAlive(1);
  let first;
  while (performance.now() - t0 < 30_000) {
    const r = await get(agent, app.port, "/", 5_000);
    first ??= r.status === 0 ? "none" : String(r.status);
    if (r.status === 200) {
      agent.destroy();
      return { first, ms: performance.now() - t0 };
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  agent.destroy();
  return { first, ms: Infinity };
}

const fmtMs = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${ms.toFixed(ms < 10 ? 1 : 0)} ms`);

async function outage(redis, deadlineMs) {
  const apps = await Promise.all(KINDS.slice(1).map(([kind]) => startApp(kind, redis.port, 1e9, HOUR)));
  const out = new Map(apps.map((a) => [a.kind, {}]));
  try {
    for (const app of apps) {
      const r = await get(keepAlive(1), app.port, "/");
      if (r.status !== 200) throw new Error(`${app.kind} before the outage: ${r.status}`);
    }
    redis.pause();
    const paused = await Promise.all(apps.map((a) => during(a, deadlineMs)));
    redis.resume();
    const resumed = await Promise.all(apps.map(recovery));
    await redis.kill();
    const stopped = await Promise.all(apps.map((a) => during(a, deadlineMs)));
    await redis.start();
    const restarted = await Promise.all(apps.map(recovery));
    apps.forEach((a, i) =>
      Object.assign(out.get(a.kind), {
        paused: paused[i],
        resumed: resumed[i],
        stopped: stopped[i],
        restarted: restarted[i],
      }),
    );
    return out;
  } finally {
    redis.resume();
    await Promise.all(apps.map((a) => stopChild(a.child)));
  }
}

async function main() {
  const { values } = parseArgs({
    options: { samples: { type: "string", default: QUICK ? "1000" : "5000" } },
  });
  const samples = Number(values.samples);
  const deadlineMs = QUICK ? 5_000 : 10_000;
  const redis = await startRedis();
  let over = false;
  try {
    console.log(
      `\nSide by side (clients/node/bench/sidebyside.mjs): one express 5 app per limiter, each in its own process, ` +
        `ioredis, a fixed window on the client's IP; redis-server with the module on loopback; ${cpus().length} CPUs ` +
        `shared by everything. ${samples} GETs timed per row, one at a time, keep-alive; a limit that admits every request ` +
        `(10^9 per hour).\n`,
    );
    const rows = await latency(redis.port, samples);
    const base = rows[0];
    console.log(
      "| app | Redis calls per admitted request | p50 | p99 | p50 ÷ no limiter's | p99 ÷ no limiter's | added to the p50 | app CPU per request | CPU added |",
    );
    console.log("|---|---|---|---|---|---|---|---|---|");
    for (const [i, row] of rows.entries()) {
      const ratio = (a, b) => (a / b).toFixed(2);
      console.log(
        `| ${KINDS[i][1]} | ${row.perRequest.toFixed(2)} | ${us(row.p50)} | ${us(row.p99)} | ` +
          `${ratio(row.p50, base.p50)} | ${ratio(row.p99, base.p99)} | ${i === 0 ? "—" : us(row.p50 - base.p50)} | ` +
          `${row.cpuUs.toFixed(0)} µs | ${i === 0 ? "—" : `${(row.cpuUs - base.cpuUs).toFixed(0)} µs`} |`,
      );
    }

    console.log(
      "\nExactness: two processes of each app on one limit of 50 per hour, 8 concurrent connections × 40 GETs to each (640):\n",
    );
    console.log("| app | admitted / limit allows | 429 | other answers |");
    console.log("|---|---|---|---|");
    for (const [kind, name] of KINDS.slice(1)) {
      const e = await exactness(redis.port, kind);
      if (OURS.has(kind)) over ||= e.admitted > e.allows;
      console.log(`| ${name} | ${e.admitted} / ${e.allows} | ${e.denied} | ${e.other} |`);
    }

    console.log(
      `\nWhile Redis is paused (SIGSTOP) and stopped (killed): four GETs to each app one after another ` +
        `(${deadlineMs / 1000} s deadline each; "none" is no answer in it), their statuses and the slowest; then, ` +
        `Redis resumed and restarted (empty, as after a failover), the first answer and how long until a 200:\n`,
    );
    console.log(
      "| app | paused: answers | slowest | resumed: first, 200 after | stopped: answers | slowest | restarted: first, 200 after |",
    );
    console.log("|---|---|---|---|---|---|---|");
    const o = await outage(redis, deadlineMs);
    for (const [kind, name] of KINDS.slice(1)) {
      const r = o.get(kind);
      console.log(
        `| ${name} | ${r.paused.statuses.join(" ")} | ${fmtMs(r.paused.slowest)} | ${r.resumed.first}, ${fmtMs(r.resumed.ms)} | ` +
          `${r.stopped.statuses.join(" ")} | ${fmtMs(r.stopped.slowest)} | ${r.restarted.first}, ${fmtMs(r.restarted.ms)} |`,
      );
    }
  } finally {
    await redis.stop();
  }
  if (over) {
    console.error("FAILED: redis-rl admitted more than the limit allows");
    process.exit(1);
  }
}

await main();
