// HTTP response fields of a decision (docs/clients.md#decision, docs/reference.md#r-reply-4):
// Retry-After, the IETF RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers), optionally X-RateLimit-*. Mirrors
// clients/go/decision.go's HeadersWith, to the byte.

import type { Decision } from "./decision.js";
import { GCRA, Window, type Limit } from "./limits.js";
import { refuseUnknown } from "./errors.js";

/** Options of decisionHeaders. */
export interface HeaderOptions {
  /** Names a single limit (default: the limit's name, else "default"). */
  policyName?: string;
  /** Names the limits of a combined decision by key as sent (default: each limit's name, else "limit1", ...). */
  names?: Readonly<Record<string, string>>;
  /** Adds X-RateLimit-Limit, -Remaining and -Reset (seconds from now) of the binding limit. */
  xHeaders?: boolean;
}

/** Milliseconds rounded up to whole seconds. */
export function ceilSeconds(ms: number): number {
  if (!(ms > 0)) return 0;
  return Math.ceil(ms / 1000);
}

function ceilNs(ns: bigint): bigint {
  return ns <= 0n ? 0n : (ns + 999_999_999n) / 1_000_000_000n;
}

function sfString(name: string): string {
  let out = '"';
  for (const ch of name) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === "\\") out += "\\";
    out += c < 0x20 || c >= 0x7f ? "?" : ch;
  }
  return out + '"';
}

function policyItem(d: Decision, name: string): string | undefined {
  const s: Limit | undefined = d.spec;
  if (s === undefined) return d.limit === 0 ? undefined : `${sfString(name)};q=${d.limit}`;
  let item = `${sfString(name)};q=${s.capacity}`;
  if (s instanceof GCRA || s instanceof Window) {
    const ns = s instanceof GCRA ? s.burst * s.intervalNs : s.windowNs;
    const secs = ceilNs(ns);
    item += `;w=${secs < 1n ? 1n : secs}`;
  } else item += ';qu="concurrent-requests"';
  return item;
}

/**
 * The HTTP response fields for a decision: Retry-After (whole seconds rounded up, at least 1)
 * when denied and retryable; RateLimit-Policy and RateLimit for every limit, in entry order
 * for a combined decision. A blind decision (the open or closed policy) carries only
 * Retry-After.
 */
export function decisionHeaders(d: Decision, options: HeaderOptions = {}): Record<string, string> {
  refuseUnknown(options, ["policyName", "names", "xHeaders"], "decisionHeaders");
  const h: Record<string, string> = {};
  if (!d.allowed && !d.never) {
    const ms = Number.isFinite(d.retryAfterMs) ? d.retryAfterMs : 9_223_372_036_854_775_807;
    h["Retry-After"] = String(Math.max(1, ceilSeconds(ms)));
  }
  if (d.blind) return h;
  const items: [string, Decision][] = [];
  if (d.perKey === undefined || d.perKey.length === 0) {
    items.push([options.policyName || d.spec?.name || "default", d]);
  } else {
    d.perKey.forEach((p, i) => items.push([options.names?.[p.key] || p.spec?.name || `limit${i + 1}`, p]));
  }
  const policies: string[] = [];
  const fields: string[] = [];
  for (const [name, p] of items) {
    const item = policyItem(p, name);
    if (item !== undefined) policies.push(item);
    fields.push(`${sfString(name)};r=${p.remaining};t=${ceilSeconds(p.resetAfterMs)}`);
  }
  if (policies.length > 0) h["RateLimit-Policy"] = policies.join(", ");
  h["RateLimit"] = fields.join(", ");
  if (options.xHeaders) {
    h["X-RateLimit-Limit"] = String(d.limit);
    h["X-RateLimit-Remaining"] = String(d.remaining);
    h["X-RateLimit-Reset"] = String(ceilSeconds(d.resetAfterMs));
  }
  return h;
}
