// What the Node benches share: a redis-server of their own on a free loopback port (with the
// module, or without it), child processes that say when they are ready, HTTP requests with a
// deadline, percentiles and number formatting. Nothing here is timed.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { request, Agent } from "node:http";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Redis } from "ioredis";

export const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
export const MODULE = process.env.RL_MODULE || join(ROOT, "target", "release", "libredis_rl.so");
export const QUICK = Boolean(process.env.BENCH_QUICK);

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
}

/**
 * A redis-server on a free loopback port (REDIS_SERVER names the binary), with the module
 * unless withModule is false; start() again after kill() brings it back on the same port,
 * empty (no persistence), as a restart or a failover to an empty replica would.
 */
export async function startRedis({ withModule = true } = {}) {
  if (withModule && !existsSync(MODULE)) {
    throw new Error(`no module at ${MODULE}: run make build (or set RL_MODULE)`);
  }
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "rl-bench-node-"));
  const bin = process.env.REDIS_SERVER || "redis-server";
  let proc;
  const server = {
    port,
    async start() {
      const args = ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
      args.push("--dir", dir, "--logfile", "redis.log");
      if (withModule) args.push("--loadmodule", MODULE);
      proc = spawn(bin, args, { stdio: "ignore" });
      const exited = new Promise((_, reject) =>
        proc.once("exit", (code) => reject(new Error(`redis-server exited (${code}); see ${dir}/redis.log`))),
      );
      exited.catch(() => {});
      const probe = new Redis({ port, host: "127.0.0.1", lazyConnect: true, retryStrategy: () => null });
      probe.on("error", () => {});
      const deadline = Date.now() + 20_000;
      try {
        for (;;) {
          try {
            await Promise.race([probe.connect(), exited]);
            const info = await probe.info("server");
            if (info.includes(`process_id:${proc.pid}\r\n`)) return;
          } catch (e) {
            if (proc.exitCode !== null) throw e;
          }
          if (Date.now() > deadline) throw new Error(`redis-server did not start on ${port}`);
          probe.disconnect();
          await sleep(50);
        }
      } finally {
        probe.disconnect();
      }
    },
    /** Stops it (SIGKILL) and waits until it has exited. */
    async kill() {
      if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
      const gone = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGKILL");
      await gone;
    },
    pause: () => proc.kill("SIGSTOP"),
    resume: () => proc.kill("SIGCONT"),
    async stop() {
      if (proc) proc.kill("SIGCONT");
      await server.kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
  await server.start();
  return server;
}

/**
 * Starts `node script ...args` and waits (up to 30 s) for its first stdout line, which it
 * returns parsed as JSON with the child (and `rest`, what followed that line in the same read):
 * the child writes one line when it is ready.
 */
export function startChild(script, args) {
  const child = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${script} ${args.join(" ")}: not ready in 30 s`));
    }, 30_000);
    const early = (code) => {
      clearTimeout(timer);
      reject(new Error(`${script} ${args.join(" ")} exited (${code}) before it was ready`));
    };
    child.once("exit", early);
    const onData = (d) => {
      out += d;
      const nl = out.indexOf("\n");
      if (nl >= 0) {
        clearTimeout(timer);
        child.off("exit", early);
        child.stdout.off("data", onData);
        resolve({ child, ready: JSON.parse(out.slice(0, nl)), rest: out.slice(nl + 1) });
      }
    };
    child.stdout.on("data", onData);
  });
}

/** Stops a child started by startChild and waits until it has exited. */
export async function stopChild(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once("exit", r));
  child.kill("SIGKILL");
  await gone;
}

/**
 * GET path on 127.0.0.1:port through agent: { status, ms } with the body's first 60
 * characters, or { status: 0, ms, error } when no answer came in deadlineMs.
 */
export function get(agent, port, path, deadlineMs = 10_000) {
  const t0 = performance.now();
  return new Promise((resolve) => {
    const req = request({ host: "127.0.0.1", port, path, agent }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (body += d));
      res.on("end", () =>
        resolve({ status: res.statusCode, ms: performance.now() - t0, body: body.slice(0, 60) }),
      );
    });
    req.setTimeout(deadlineMs, () => req.destroy(new Error("deadline")));
    req.on("error", (e) => resolve({ status: 0, ms: performance.now() - t0, error: e.message }));
    req.end();
  });
}

export const keepAlive = (maxSockets) => new Agent({ keepAlive: true, maxSockets });

/** The p-th percentile (0..100) of sorted numbers. */
export function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))];
}

export function thousands(x) {
  return Math.round(x).toLocaleString("en-US");
}

export function us(ms) {
  return `${(ms * 1000).toFixed(1)} µs`;
}
