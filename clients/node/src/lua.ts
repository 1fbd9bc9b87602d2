// The project's Lua fallback, the Functions library redis_rl, embedded at build time from the
// repository's one copy, scripts/lua/redis_rl.lua (scripts/generate.mjs). Mirrors
// clients/go/lua.go.

import { createHash } from "node:crypto";
import { LUA_LIBRARY } from "./library.generated.js";

/** The Lua fallback's text (FUNCTION LOAD it yourself where clients may not: loadLibrary). */
export const LUA_LIBRARY_TEXT: string = LUA_LIBRARY;

/** The Functions library's name (#!lua name=redis_rl). */
export const LIBRARY_NAME = "redis_rl";

/** The library version a library's code declares (local VERSION = '1.3.0'). */
export function libraryVersion(code: string): string {
  const m = /local VERSION = '([^']*)'/.exec(code);
  return m ? m[1]! : "";
}

/** This package's library version. */
export const LIBRARY_VERSION = libraryVersion(LUA_LIBRARY);

/**
 * The fallback as a script, for servers where FUNCTION is not allowed: the library without
 * its #!lua line, run as EVAL/EVALSHA sha numkeys key ... name arg ... (ARGV[1] names the
 * function).
 */
export const SCRIPT_TEXT: string = (() => {
  const i = LUA_LIBRARY.indexOf("\n");
  return i < 0 ? LUA_LIBRARY : LUA_LIBRARY.slice(i + 1);
})();

/** The SHA1 the server knows SCRIPT_TEXT by (EVALSHA), lower-case hex. */
export const SCRIPT_SHA: string = createHash("sha1").update(SCRIPT_TEXT).digest("hex");
