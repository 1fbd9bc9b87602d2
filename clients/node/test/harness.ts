// The real-server harness: redis-server on a free loopback port, in a temporary directory,
// with the redis-rl module loaded (module mode) or without it (fallback mode), stopped by
// PID; every wait has a deadline. Never :6379. Mirrors clients/go/internal/testserver.
//
// REDIS_SERVER names the server binary (default redis-server on PATH, else
// /usr/bin/redis-server); RL_MODULE the module (default: the repository's
// target/release/libredis_rl.so).
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import {
  closeSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Redis, Cluster } from "ioredis";
import { createClient, createCluster } from "redis";
import { createClient as createClientV4 } from "redis-v4";
import { createClient as createClientV5 } from "redis-v5";
import { Redis as RedisV5 } from "ioredis-v5";
import { RateLimiter, type RateLimiterOptions } from "../src/index.js";

const ROOT = fileURLToPath(new URL("../../../..", import.meta.url)); // build/test -> repository
export const MODULE = process.env["RL_MODULE"] || join(ROOT, "target", "release", "libredis_rl.so");

export function binary(): string {
  if (process.env["REDIS_SERVER"]) return process.env["REDIS_SERVER"];
  try {
    return (
      execFileSync("sh", ["-c", "command -v redis-server"], { encoding: "utf8" }).trim() ||
      "/usr/bin/redis-server"
    );
  } catch {
    return "/usr/bin/redis-server";
  }
}

export const MAJOR = (() => {
  const out = execFileSync(binary(), ["--version"], { encoding: "utf8" });
  const m = /v=(\d+)\./.exec(out);
  if (!m) throw new Error(`no version in ${out}`);
  return Number(m[1]);
})();

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** One raw command over a fresh socket (outside any client library): the reply's text. */
export function rawCommand(port: number, args: string[], timeoutMs = 2000): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = connect(port, "127.0.0.1");
    let data = "";
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error("no reply"));
    }, timeoutMs);
    sock.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    sock.on("data", (d) => {
      data += d.toString();
      if (data.endsWith("\r\n")) {
        clearTimeout(timer);
        sock.end();
        resolve(data);
      }
    });
    sock.write(`*${args.length}\r\n` + args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join(""));
  });
}

export class Server {
  port = 0;
  readonly dir = mkdtempSync(join(tmpdir(), "redisrl-node-"));
  private proc: ChildProcess | undefined;
  constructor(
    readonly module: boolean,
    readonly extra: string[] = [],
    /** Added to the server's environment (the clock shim's LD_PRELOAD). */
    readonly env: Record<string, string> = {},
  ) {}

  get args(): string[] {
    const a = ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    a.push("--dir", this.dir, "--logfile", join(this.dir, "redis.log"));
    if (this.module) {
      if (!existsSync(MODULE))
        throw new Error(`the module is not built (${MODULE}): run make build, or set RL_MODULE`);
      a.push("--loadmodule", MODULE);
    }
    return [...a, ...this.extra];
  }

  async start(): Promise<this> {
    if (this.port === 0) this.port = await freePort();
    this.proc = spawn(binary(), this.args, { stdio: "ignore", env: { ...process.env, ...this.env } });
    const deadline = Date.now() + 10_000;
    for (;;) {
      try {
        if ((await rawCommand(this.port, ["PING"], 500)).startsWith("+PONG")) return this;
      } catch {
        // not up yet
      }
      if (this.proc.exitCode !== null || Date.now() > deadline) {
        this.stop();
        throw new Error(`redis-server did not answer within 10 s: ${this.log()}`);
      }
      await sleep(20);
    }
  }

  log(): string {
    try {
      return readFileSync(join(this.dir, "redis.log"), "utf8");
    } catch {
      return "";
    }
  }

  /** Kills the server by its PID and waits (with a deadline) until it has exited. */
  async kill(): Promise<void> {
    const p = this.proc;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((r) => p.once("exit", r));
    p.kill("SIGCONT");
    p.kill("SIGKILL");
    await Promise.race([exited, sleep(10_000)]);
    this.proc = undefined;
  }

  stop(): void {
    this.proc?.kill("SIGCONT");
    this.proc?.kill("SIGKILL");
  }

  pause(): void {
    this.proc?.kill("SIGSTOP");
  }

  resume(): void {
    this.proc?.kill("SIGCONT");
  }

  async restart(): Promise<void> {
    await this.kill();
    await this.start();
  }

  async remove(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** A command outside any limiter. */
  do(...args: string[]): Promise<string> {
    return rawCommand(this.port, args);
  }
}

export type Lib = "ioredis" | "node-redis" | "node-redis-v4" | "node-redis-v5" | "ioredis-v5";
/** The older majors the behaviour suite also runs on (one server). */
export const OLDER_LIBS = ["ioredis-v5", "node-redis-v5", "node-redis-v4"] as const;
/**
 * The client libraries every test runs on, at their current majors (ioredis 6, node-redis 6;
 * the older majors on one server: the behaviour suite).
 */
export const LIBS: ("ioredis" | "node-redis")[] = ["ioredis", "node-redis"];

/** A client of the server for lib, and how to close it. */
export async function clientFor(
  lib: Lib,
  port: number,
): Promise<{ client: unknown; close: () => Promise<void> }> {
  if (lib === "ioredis" || lib === "ioredis-v5") {
    const options = { port, host: "127.0.0.1", lazyConnect: false, maxRetriesPerRequest: 1 };
    const c = lib === "ioredis" ? new Redis(options) : new RedisV5(options);
    c.on("error", () => {});
    return { client: c, close: async () => void c.disconnect() };
  }
  if (lib === "node-redis-v5") {
    const c = createClientV5({ socket: { port, host: "127.0.0.1", reconnectStrategy: () => 50 } });
    c.on("error", () => {});
    await c.connect();
    return { client: c, close: async () => void c.destroy() };
  }
  if (lib === "node-redis-v4") {
    const c = createClientV4({ socket: { port, host: "127.0.0.1", reconnectStrategy: () => 50 } });
    c.on("error", () => {});
    await c.connect();
    return { client: c, close: async () => void (await c.disconnect().catch(() => {})) };
  }
  const c = createClient({ socket: { port, host: "127.0.0.1", reconnectStrategy: () => 50 } });
  c.on("error", () => {});
  await c.connect();
  return {
    client: c,
    close: async () => {
      try {
        c.destroy();
      } catch {
        // closed already
      }
    },
  };
}

/** A limiter on a fresh client of lib, and its closing. */
export async function limiterFor(
  lib: Lib,
  port: number,
  options: Omit<RateLimiterOptions, "client" | "sendCommand"> = {},
): Promise<{ limiter: RateLimiter; close: () => Promise<void>; client: unknown }> {
  const { client, close } = await clientFor(lib, port);
  return { limiter: new RateLimiter({ client, ...options }), close, client };
}

let prefixCounter = 0;
/** A key prefix no other test of this process uses. */
export function uniquePrefix(name: string): string {
  return `t${++prefixCounter}.${name.replace(/[^A-Za-z0-9]+/g, "_")}:`;
}

// ---- Cluster -------------------------------------------------------------------------------

/** Starts three cluster-enabled masters and joins them (redis-cli --cluster create). */
export async function startCluster(module: boolean): Promise<Server[]> {
  const nodes: Server[] = [];
  for (let i = 0; i < 3; i++) {
    const bus = await freePort();
    const extra = [
      "--cluster-enabled",
      "yes",
      "--cluster-config-file",
      "nodes.conf",
      "--cluster-node-timeout",
      "5000",
    ];
    if (MAJOR >= 7) extra.push("--cluster-port", String(bus));
    nodes.push(await new Server(module, extra).start());
  }
  execFileSync(
    "redis-cli",
    [
      "--cluster",
      "create",
      ...nodes.map((n) => `127.0.0.1:${n.port}`),
      "--cluster-replicas",
      "0",
      "--cluster-yes",
    ],
    { stdio: "pipe", timeout: 30_000 },
  );
  const deadline = Date.now() + 20_000;
  for (const n of nodes) {
    for (;;) {
      const info = await n.do("CLUSTER", "INFO").catch(() => "");
      if (info.includes("cluster_state:ok")) break;
      if (Date.now() > deadline) throw new Error(`the cluster did not form within 20 s: ${info}`);
      await sleep(50);
    }
  }
  return nodes;
}

export async function clusterClientFor(
  lib: Lib,
  nodes: Server[],
): Promise<{ client: unknown; close: () => Promise<void> }> {
  if (lib === "ioredis") {
    const c = new Cluster(nodes.map((n) => ({ host: "127.0.0.1", port: n.port })));
    c.on("error", () => {});
    return { client: c, close: async () => void c.disconnect() };
  }
  const c = createCluster({ rootNodes: nodes.map((n) => ({ socket: { host: "127.0.0.1", port: n.port } })) });
  c.on("error", () => {});
  await c.connect();
  return { client: c, close: async () => void c.destroy() };
}

// ---- the clock shim ----------------------------------------------------------------------------

/**
 * The repository's test clock (tests/support/clock_shim.c), built here with cc: a server
 * started with `env` reads its real-time clock as freezeAt sets it, exactly.
 */
export class FrozenClock {
  readonly env: Record<string, string>;
  private readonly fd: number;
  constructor(readonly dir: string) {
    const source = join(ROOT, "tests", "support", "clock_shim.c");
    const shim = join(dir, "libclockshim.so");
    execFileSync(process.env["CC"] || "cc", ["-O2", "-shared", "-fPIC", "-o", shim, source], {
      stdio: "pipe",
    });
    const path = join(dir, "offset");
    writeFileSync(path, Buffer.alloc(16));
    this.fd = openSync(path, "r+");
    this.env = { LD_PRELOAD: shim, RL_CLOCK_OFFSET_FILE: path };
  }
  /** Makes the server's clock read exactly ns since the epoch. */
  freezeAt(ns: bigint): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(ns > 0n ? ns : 1n);
    writeSync(this.fd, b, 0, 8, 8);
  }
  close(): void {
    closeSync(this.fd);
  }
}
