// The one send-function the core talks through (rate-limit-redis's idea): every command is
// `send(args, key)`, routed by `key` on a Cluster, and the few calls that must reach each
// master (FCALL_RO rl_version, FUNCTION LOAD, SCRIPT LOAD, the OOM twin) go through a
// master's handle. Thin adapters make one from ioredis (Redis, Cluster), node-redis
// (createClient, createCluster) or a plain send-function; this file imports neither library.

import { RedisReplyError, usage } from "./errors.js";
import { keySlot } from "./slots.js";

/** A plain send-function: one command as strings in, its reply out (a rejected promise for an error). */
export type SendCommand = (args: string[]) => Promise<unknown>;

/** One server: a master of a Cluster, or the one server. */
export interface NodeHandle {
  /** "host:port" on a Cluster, "" for the one server. */
  readonly id: string;
  send(args: readonly string[]): Promise<unknown>;
}

/** What the core needs of a Redis client. */
export interface Transport {
  readonly cluster: boolean;
  /** Sends one command; on a Cluster, to the master of `key`'s slot (any node without a key). */
  send(args: readonly string[], key: string | undefined): Promise<unknown>;
  /** Every master (read again each time: a master added since is among them), or the one server. */
  masters(): Promise<NodeHandle[]>;
  /** The master of key's slot (the one server when not a Cluster). */
  masterFor(key: string): Promise<NodeHandle>;
}

/** Turns a client library's error reply into a RedisReplyError; other errors stay as they are. */
export function normalizeError(e: unknown): unknown {
  if (e instanceof RedisReplyError) return e;
  if (e instanceof Error) {
    for (let p = Object.getPrototypeOf(e); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
      const name = (p.constructor as { name?: string } | undefined)?.name;
      if (name === "ReplyError" || name === "ErrorReply") return new RedisReplyError(e.message, e);
    }
  }
  return e;
}

async function sent(p: () => Promise<unknown>): Promise<unknown> {
  try {
    return await p();
  } catch (e) {
    throw normalizeError(e);
  }
}

function single(fn: SendCommand): Transport {
  const node: NodeHandle = { id: "", send: (args) => sent(() => fn([...args])) };
  return {
    cluster: false,
    send: (args) => node.send(args),
    masters: async () => [node],
    masterFor: async () => node,
  };
}

type AnyFn = (...a: unknown[]) => unknown;
type Obj = Record<string, unknown>;

function fn(o: unknown, name: string): AnyFn | undefined {
  const f = o && typeof o === "object" ? (o as Obj)[name] : undefined;
  return typeof f === "function" ? (f as AnyFn).bind(o) : undefined;
}

function ioredisSend(client: unknown): SendCommand {
  const call = fn(client, "call")!;
  return (args) => call(args[0], ...args.slice(1)) as Promise<unknown>;
}

function ioredisCluster(cluster: Obj): Transport {
  const nodes = fn(cluster, "nodes")!;
  const addr = (n: unknown) => {
    const o = (n as { options?: { host?: string; port?: number } }).options ?? {};
    return `${o.host}:${o.port}`;
  };
  const handle = (n: unknown): NodeHandle => {
    const s = ioredisSend(n);
    return { id: addr(n), send: (args) => sent(() => s([...args])) };
  };
  const byAddr = (a: string) => (nodes("master") as unknown[]).find((n) => addr(n) === a);
  const nodeForKey = (key: string) => {
    const slots = cluster["slots"] as unknown[][] | undefined;
    const a = slots?.[keySlot(key)]?.[0];
    return typeof a === "string" ? byAddr(a) : undefined;
  };
  const any = ioredisSend(cluster);
  return {
    cluster: true,
    async send(args, key) {
      if (key === undefined) return sent(() => any([...args]));
      let node = nodeForKey(key);
      if (node === undefined) {
        // The slot table is not read yet (a new Cluster client): a keyless call reads it.
        await sent(() => any(["PING"]));
        node = nodeForKey(key);
      }
      if (node === undefined) return sent(() => any([...args]));
      try {
        return await handle(node).send(args);
      } catch (e) {
        // The slot moved (a resharding, a failover): ask the node it names, once, and
        // read the slot table again for the calls after this one.
        const m = e instanceof RedisReplyError ? /^MOVED [0-9]+ (\S+)$/.exec(e.reply) : null;
        const target = m ? byAddr(m[1]!) : undefined;
        if (target === undefined) throw e;
        const refresh = fn(cluster, "refreshSlotsCache");
        if (refresh) refresh(() => {});
        return handle(target).send(args);
      }
    },
    async masters() {
      let list = nodes("master") as unknown[];
      if (list.length === 0) {
        await sent(() => any(["PING"]));
        list = nodes("master") as unknown[];
      }
      return list.map(handle).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    },
    async masterFor(key) {
      let node = nodeForKey(key);
      if (node === undefined) {
        await sent(() => any(["PING"]));
        node = nodeForKey(key);
      }
      if (node === undefined) throw new Error(`redis-rl: no master known for the slot of '${key}'`);
      return handle(node);
    },
  };
}

function nodeRedisCluster(cluster: Obj): Transport {
  const sendCommand = fn(cluster, "sendCommand")!;
  const nodeClient = fn(cluster, "nodeClient")!;
  const handle = async (m: unknown): Promise<NodeHandle> => {
    const c = await nodeClient(m);
    const s = fn(c, "sendCommand")!;
    return {
      id: String((m as { address?: string }).address ?? ""),
      send: (args) => sent(() => s([...args]) as Promise<unknown>),
    };
  };
  return {
    cluster: true,
    send: (args, key) => sent(() => sendCommand(key, false, [...args]) as Promise<unknown>),
    async masters() {
      const list = (cluster["masters"] as unknown[] | undefined) ?? [];
      const out = await Promise.all(list.map(handle));
      return out.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    },
    async masterFor(key) {
      const slot = keySlot(key);
      const slots = cluster["slots"] as ({ master?: unknown } | undefined)[] | undefined;
      let master = slots?.[slot]?.master;
      const getSlotMaster = fn(cluster, "getSlotMaster");
      if (master === undefined && getSlotMaster) master = getSlotMaster(slot);
      if (master === undefined) throw new Error(`redis-rl: no master known for the slot of '${key}'`);
      return handle(master);
    },
  };
}

/**
 * The transport of a client: an ioredis Redis or Cluster, a node-redis client or cluster
 * (connected by the application), or a plain send-function (one server).
 */
export function transportFor(client: unknown, sendCommand: SendCommand | undefined): Transport {
  if (sendCommand !== undefined) {
    if (client !== undefined) throw usage("give either client or sendCommand, not both");
    if (typeof sendCommand !== "function")
      throw usage("sendCommand must be a function (args: string[]) => Promise<reply>");
    return single(sendCommand);
  }
  if (client === null || typeof client !== "object") {
    throw usage(
      "RateLimiter needs a client (ioredis or node-redis, single server or Cluster) or a sendCommand function",
    );
  }
  const o = client as Obj;
  if (o["isCluster"] === true && fn(o, "nodes") && fn(o, "call")) return ioredisCluster(o);
  if (fn(o, "call") && o["options"] !== undefined && fn(o, "duplicate")) return single(ioredisSend(o));
  if (fn(o, "nodeClient") && "masters" in o && fn(o, "sendCommand")) return nodeRedisCluster(o);
  const sc = fn(o, "sendCommand");
  if (sc) return single((args) => sc(args) as Promise<unknown>);
  throw usage("client is neither an ioredis nor a node-redis client: pass sendCommand for another library");
}
