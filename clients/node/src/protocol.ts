// The wire: the module's commands or the fallback's calls with the same arguments, how
// errors are told apart, and the library plan (docs/clients.md#the-fallback-where-users-are).
// Mirrors clients/go/protocol.go and clients/go/errors.go.

import { RedisReplyError, RedisTimeoutError } from "./errors.js";
import { LIBRARY_NAME, libraryVersion, SCRIPT_TEXT } from "./lua.js";

/** module: the RL.* commands; fallback: the Lua library; auto: asks the server once. */
export type Mode = "auto" | "module" | "fallback";

export type Op = "gcra" | "window" | "all" | "refund" | "lease" | "release";

export const COMMAND: Record<Op, string> = {
  gcra: "RL.GCRA",
  window: "RL.WINDOW",
  all: "RL.ALL",
  refund: "RL.REFUND",
  lease: "RL.LEASE",
  release: "RL.RELEASE",
};

export function functionName(op: Op): string {
  return `rl_${op}`;
}

/**
 * The no-writes twin of a writing function that may grow memory (library 1.3.0): FCALL_RO
 * rl_<op>_ro (docs/clients.md#out-of-memory). Refunds and releases only free: none.
 */
export function twinName(op: Op): string | undefined {
  return op === "refund" || op === "release" ? undefined : `rl_${op}_ro`;
}

/** How the fallback is called. */
export type ScriptCall = "functions" | "sha" | "text";

/** The wire command for op: the module's command, or the fallback's call. */
export function frame(
  mode: "module" | "fallback",
  call: ScriptCall,
  sha: string,
  op: Op,
  keys: readonly string[],
  args: readonly string[],
): string[] {
  const out: string[] = [];
  if (mode === "fallback") {
    if (call === "sha") out.push("EVALSHA", sha);
    else if (call === "text") out.push("EVAL", SCRIPT_TEXT);
    else out.push("FCALL", functionName(op));
    out.push(String(keys.length));
  } else {
    out.push(COMMAND[op]);
    if (op === "all") out.push(String(keys.length));
  }
  out.push(...keys);
  if (mode === "fallback" && call !== "functions") out.push(functionName(op));
  out.push(...args);
  return out;
}

// ---- errors -------------------------------------------------------------------------------

/** The server's error text of an error reply, or "" for any other error. */
export function serverError(e: unknown): string {
  return e instanceof RedisReplyError ? e.reply : "";
}

export function errorCode(e: unknown): string {
  return e instanceof RedisReplyError ? e.replyCode : "";
}

const OUTAGE_CODES = new Set(["OOM", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY"]);

/**
 * Tells an outage (the failure policy answers it) from a misuse (always an error): the one
 * function that decides it. Outages: any failure to get a reply (refused or lost connection,
 * the limiter's timeout, the client's own) and the replies OOM, LOADING, MASTERDOWN,
 * CLUSTERDOWN, TRYAGAIN and READONLY. Misuses: every other error reply, a closed client, and
 * this package's own errors.
 */
export function isUnavailable(e: unknown): boolean {
  if (e === undefined || e === null) return false;
  if (e instanceof RedisReplyError) return OUTAGE_CODES.has(e.replyCode);
  if (e instanceof RedisTimeoutError) return true;
  if (!(e instanceof Error)) return false;
  if (
    (e as { code?: unknown }).code !== undefined &&
    String((e as { code?: unknown }).code).startsWith("ERR_RL_")
  )
    return false;
  if (e.name === "AbortError" && !/connection|socket/i.test(e.message)) return false;
  // node-redis: a client the application closed (not a lost connection).
  if (e.message === "The client is closed") return false;
  return true;
}

/** A failure of the connection, not a timeout: retried once (docs/clients.md#recovery). */
export function isConnectionLevel(e: unknown): boolean {
  if (!(e instanceof Error) || e instanceof RedisReplyError || e instanceof RedisTimeoutError) return false;
  const code = String((e as { code?: unknown }).code ?? "");
  return (
    ["ECONNREFUSED", "ECONNRESET", "EPIPE"].includes(code) ||
    /connection is closed|socket closed unexpectedly|econnreset|epipe/i.test(e.message)
  );
}

/** The module is not (or no longer) loaded here. */
export function isUnknownCommand(e: unknown): boolean {
  const m = serverError(e).toLowerCase();
  return m.includes("unknown command") && m.includes("rl.");
}

/**
 * The server refuses a command to this client: unknown (Redis 6.x, renamed away), not
 * permitted by its ACL, or a scripting command on a server that runs no Lua. A NOPERM on one
 * of the keys is not a refused command: it is reported as it is.
 */
export function isRefused(e: unknown): boolean {
  const m = serverError(e).toLowerCase();
  const noperm = errorCode(e) === "NOPERM" || m.includes("noperm");
  return (
    m.includes("unknown command") ||
    (noperm && m.includes("command")) ||
    m.includes("engine 'lua'") ||
    m.includes("scripting engine")
  );
}

export function isOOM(e: unknown): boolean {
  return errorCode(e) === "OOM";
}

export function isMissingFunction(e: unknown): boolean {
  const m = serverError(e).toLowerCase();
  return m.includes("function not found") || m.includes("no such function");
}

export function isNoScript(e: unknown): boolean {
  return serverError(e).startsWith("NOSCRIPT");
}

export function isRedirect(e: unknown): boolean {
  const c = errorCode(e);
  return c === "MOVED" || c === "ASK";
}

// ---- replies ------------------------------------------------------------------------------

/** Reads a COMMAND INFO name reply: whether the command exists. */
export function commandExists(v: unknown): boolean {
  if (v === null || v === undefined) return false;
  if (Array.isArray(v)) return v.some((x) => x !== null && x !== undefined);
  if (v instanceof Map) return [...v.values()].some((x) => x !== null && x !== undefined);
  return true;
}

export type LibraryPlan = "keep" | "load" | "replace" | "newer";

function versionKey(v: string): number[] | undefined {
  const parts = v.split(".");
  if (parts.some((p) => !/^[0-9]+$/.test(p))) return undefined;
  return parts.map(Number);
}

/**
 * Compares the server's library version (loaded false: no library) with ours: a client
 * never replaces a newer library with an older one (a rolling deploy runs two versions).
 */
export function planFor(theirs: string, loaded: boolean, ours: string): LibraryPlan {
  if (!loaded) return "load";
  if (theirs === ours) return "keep";
  const t = versionKey(theirs);
  const o = versionKey(ours);
  if (t && o) {
    for (let i = 0; i < Math.max(t.length, o.length); i++) {
      const a = t[i] ?? 0;
      const b = o[i] ?? 0;
      if (a !== b) return a > b ? "newer" : "replace";
    }
    if (t.length > o.length) return "newer";
  }
  return "replace";
}

const SETTING_LINES = ["LOG_MAX_LIMIT", "LEASE_MAX_LIMIT", "ALL_MAX_KEYS"];

function setting(code: string, variable: string): number | undefined {
  const prefix = `local ${variable} = `;
  for (const line of code.split("\n")) {
    if (line.startsWith(prefix)) {
      const v = line.slice(prefix.length).replace(/[ \t\r]+$/, "");
      return /^[0-9]+$/.test(v) ? Number(v) : undefined;
    }
  }
  return undefined;
}

/**
 * Our library's code with the settings of the library it replaces kept, so an upgrade does
 * not reset an operator's rl.log-max-limit, rl.lease-max-limit or rl.all-max-keys.
 */
export function configuredCode(ours: string, theirs: string): string {
  let code = ours;
  for (const variable of SETTING_LINES) {
    const kept = setting(theirs, variable);
    const def = setting(ours, variable);
    if (kept === undefined || def === undefined || kept === 0 || kept === def) continue;
    code = code.replace(`local ${variable} = ${def}\n`, `local ${variable} = ${kept}\n`);
  }
  return code;
}

function text(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (Buffer.isBuffer(v)) return v.toString();
  return undefined;
}

/** Reads FUNCTION LIST LIBRARYNAME redis_rl WITHCODE (RESP2 or RESP3). */
export function listedLibrary(listing: unknown): { version: string; code: string } | undefined {
  if (!Array.isArray(listing)) return undefined;
  for (const entry of listing) {
    const fields = new Map<string, unknown>();
    if (Array.isArray(entry)) {
      for (let i = 0; i + 1 < entry.length; i += 2) {
        const k = text(entry[i]);
        if (k !== undefined) fields.set(k, entry[i + 1]);
      }
    } else if (entry instanceof Map) {
      for (const [k, v] of entry) {
        const ks = text(k);
        if (ks !== undefined) fields.set(ks, v);
      }
    } else if (entry && typeof entry === "object") {
      for (const [k, v] of Object.entries(entry)) fields.set(k, v);
    } else continue;
    if (text(fields.get("library_name")) !== LIBRARY_NAME) continue;
    const code = text(fields.get("library_code")) ?? "";
    return { version: libraryVersion(code), code };
  }
  return undefined;
}
