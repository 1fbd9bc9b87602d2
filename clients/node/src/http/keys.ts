// Identity values in keys (docs/clients.md#identity-values, docs/clients.md#escaped-values,
// docs/clients.md#key-layout): every package spells a key to the byte as the others do, so
// services in several languages share buckets. Mirrors clients/go/keys.go (SafeKeyPart,
// IdentityKey) and clients/go/rlhttp/clientip.go (NormalizeList).

import { createHash } from "node:crypto";

/** The most UTF-8 bytes a value keeps as itself in a key; longer ones are hashed. */
const MAX_LITERAL = 128;

const SAFE = new Uint8Array(256);
for (let c = 0; c < 256; c++) {
  const ch = String.fromCharCode(c);
  SAFE[c] = /[A-Za-z0-9._:@/+=-]/.test(ch) ? 1 : 0;
}
const HEX = "0123456789ABCDEF";

/**
 * Makes a client-supplied value safe inside a Redis key: every byte of its UTF-8 form but
 * `A-Z a-z 0-9 . _ : @ / + = -` is percent-encoded (upper-case hex: braces, spaces, control
 * bytes, `%`, `~`), so no value can pick a hash tag; a value of more than 128 UTF-8 bytes is
 * `~sha256:` and the lower-case hex SHA-256 of its bytes, a form no literal value can take (a
 * literal `~` is `%7E`).
 */
export function safeKeyPart(value: string): string {
  const bytes = Buffer.from(value, "utf8");
  if (bytes.length > MAX_LITERAL) {
    return "~sha256:" + createHash("sha256").update(bytes).digest("hex");
  }
  let out = "";
  for (const b of bytes) {
    out += SAFE[b] ? String.fromCharCode(b) : "%" + HEX[b >> 4] + HEX[b & 15];
  }
  return out;
}

/**
 * The key of one identity under one limit: `<name>:{<kind>:<value>}`, or
 * `{<hashTag>}:<name>:<kind>:<value>` with a rule's hash tag; name, kind and value each
 * escaped with safeKeyPart. The limiter's prefix is added when the key is sent.
 */
export function identityKey(name: string, kind: string, value: string, hashTag = ""): string {
  const n = safeKeyPart(name);
  const k = safeKeyPart(kind);
  const v = safeKeyPart(value);
  if (hashTag !== "") return `{${hashTag}}:${n}:${k}:${v}`;
  return `${n}:{${k}:${v}}`;
}

/**
 * One header field's lines as one list value: each line split on `,`, each element trimmed
 * of spaces and tabs, joined with `", "` (empty elements kept). A header read as a key is
 * this value.
 */
export function normalizeList(lines: readonly string[]): string {
  const parts: string[] = [];
  for (const line of lines) for (const e of line.split(",")) parts.push(e.replace(/^[ \t]+|[ \t]+$/g, ""));
  return parts.join(", ");
}
