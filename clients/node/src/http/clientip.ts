// The client's address behind trusted proxies (docs/clients.md#client-ip,
// docs/clients.md#no-usable-client-address). Mirrors clients/go/rlhttp/clientip.go.

import { isIPv4, isIPv6 } from "node:net";
import { badOption, refuseUnknown } from "../errors.js";

/** The ip identity's value when a request has no usable client address: one shared bucket. */
export const UNKNOWN_IP = "unknown";

/** An address: 4 bytes (IPv4, also an IPv4-mapped IPv6 address) or 16. */
interface Addr {
  readonly bytes: Uint8Array;
}

function parseV4(s: string): Uint8Array | undefined {
  if (!isIPv4(s)) return undefined;
  const parts = s.split(".");
  if (parts.some((p) => p.length > 1 && p.startsWith("0"))) return undefined;
  return Uint8Array.from(parts.map(Number));
}

function parseV6(s: string): Uint8Array | undefined {
  if (s.includes("%") || !isIPv6(s)) return undefined;
  let text = s.toLowerCase();
  const m = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (m) {
    // An IPv4 tail is the last two groups.
    const v4 = parseV4(m[2]!);
    if (!v4) return undefined;
    text = m[1]! + ((v4[0]! << 8) | v4[1]!).toString(16) + ":" + ((v4[2]! << 8) | v4[3]!).toString(16);
  }
  const halves = text.split("::");
  if (halves.length > 2) return undefined;
  const split = (h: string) => (h === "" ? [] : h.split(":"));
  const head = split(halves[0]!);
  const tail = halves.length === 2 ? split(halves[1]!) : [];
  const fill = halves.length === 2 ? 8 - head.length - tail.length : 0;
  if (fill < 0) return undefined;
  const groups = [...head, ...new Array<string>(fill).fill("0"), ...tail];
  if (groups.length !== 8 || groups.some((g) => !/^[0-9a-f]{1,4}$/.test(g))) return undefined;
  const out = new Uint8Array(16);
  groups.forEach((g, i) => {
    const w = parseInt(g, 16);
    out[2 * i] = w >> 8;
    out[2 * i + 1] = w & 0xff;
  });
  return out;
}

function isMapped(b: Uint8Array): boolean {
  if (b.length !== 16) return false;
  for (let i = 0; i < 10; i++) if (b[i] !== 0) return false;
  return b[10] === 0xff && b[11] === 0xff;
}

/** An address from text (no zone, no port), IPv4-mapped IPv6 as IPv4; undefined if not one. */
export function parseIp(text: string): Addr | undefined {
  const v4 = parseV4(text);
  if (v4) return { bytes: v4 };
  const v6 = parseV6(text);
  if (!v6) return undefined;
  return { bytes: isMapped(v6) ? v6.slice(12) : v6 };
}

/** An IPv6 address as RFC 5952 writes it (Go's netip): the longest run of 2+ zero groups is "::". */
function formatV6(b: Uint8Array): string {
  const w: number[] = [];
  for (let i = 0; i < 16; i += 2) w.push((b[i]! << 8) | b[i + 1]!);
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8;) {
    if (w[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && w[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hexs = w.map((x) => x.toString(16));
  if (best < 0) return hexs.join(":");
  return hexs.slice(0, best).join(":") + "::" + hexs.slice(best + bestLen).join(":");
}

export function formatIp(a: Addr): string {
  return a.bytes.length === 4 ? a.bytes.join(".") : formatV6(a.bytes);
}

function masked(bytes: Uint8Array, bits: number): Uint8Array {
  const out = bytes.slice();
  for (let i = 0; i < out.length; i++) {
    const keep = Math.max(0, Math.min(8, bits - 8 * i));
    out[i] = out[i]! & ((0xff << (8 - keep)) & 0xff);
  }
  return out;
}

interface Net {
  bytes: Uint8Array;
  bits: number;
}

function contains(n: Net, a: Addr): boolean {
  if (n.bytes.length !== a.bytes.length) return false;
  const m = masked(a.bytes, n.bits);
  return m.every((x, i) => x === n.bytes[i]);
}

/** Options of a client-IP rule (clientIp in the middlewares' options). */
export interface ClientIpOptions {
  /**
   * The trusted proxies: addresses, CIDR networks, and "unix" (a peer without an IP address,
   * a Unix socket, is a trusted proxy). Default none: the socket peer is the client.
   */
  trustedProxies?: readonly string[];
  /** The one forwarding header trusted proxies write: "x-forwarded-for" (default) or "forwarded" (RFC 7239). */
  header?: "x-forwarded-for" | "forwarded";
  /** IPv6 clients are keyed by their first ipv6Prefix bits: 48 to 128, default 64. */
  ipv6Prefix?: number;
  /**
   * Take the client's address from the framework instead (express's req.ip under its
   * `trust proxy` setting, fastify's request.ip under `trustProxy`), keyed the same way
   * (IPv4-mapped as IPv4, IPv6 by its prefix). Exclusive with trustedProxies and header.
   */
  fromFramework?: boolean;
}

const CLIENT_IP_OPTIONS = ["trustedProxies", "header", "ipv6Prefix", "fromFramework"] as const;

/** What the rule found: the key, whether there was a usable address, whether a header was unusable. */
export interface ClientAddress {
  /** The ip identity's value: the address (IPv6: its network, "2001:db8:1:2::/64"), or "unknown". */
  readonly key: string;
  /** No usable client address: key is "unknown" (counted peerUnknown). */
  readonly unknown: boolean;
  /** A forwarding header was unusable and the peer was taken (counted forwardedUnusable). */
  readonly unusable: boolean;
}

/**
 * The client-IP rule. The socket peer is the client unless it is a trusted proxy; then exactly
 * one forwarding header is read (never both), every line of it, and the rightmost address not
 * in the trusted set is the client (what a client writes at the left is ignored). An unusable
 * value (garbage, a port-only entry, an "unknown" or obfuscated hop, a stray quote, an empty
 * list) falls back to the peer address and is reported. No header: the proxy itself is the
 * client. Every hop trusted: the leftmost is the client.
 */
export class ClientIp {
  readonly header: "x-forwarded-for" | "forwarded";
  readonly ipv6Prefix: number;
  readonly fromFramework: boolean;
  private readonly trusted: Net[] = [];
  private readonly trustUnix: boolean = false;

  constructor(options: ClientIpOptions = {}) {
    refuseUnknown(options, CLIENT_IP_OPTIONS, "clientIp");
    const o = options ?? {};
    this.header = o.header ?? "x-forwarded-for";
    if (this.header !== "x-forwarded-for" && this.header !== "forwarded") {
      throw badOption(
        `clientIp.header must be "x-forwarded-for" or "forwarded", not ${JSON.stringify(o.header)}`,
      );
    }
    const bits = o.ipv6Prefix ?? 64;
    if (!Number.isInteger(bits) || bits < 48 || bits > 128)
      throw badOption("clientIp.ipv6Prefix must be 48 to 128");
    this.ipv6Prefix = bits;
    if (o.fromFramework !== undefined && typeof o.fromFramework !== "boolean") {
      throw badOption("clientIp.fromFramework must be a boolean");
    }
    this.fromFramework = o.fromFramework === true;
    if (this.fromFramework && (o.trustedProxies !== undefined || o.header !== undefined)) {
      throw badOption(
        "clientIp.fromFramework takes the address the framework computed (express trust proxy, fastify trustProxy): give no trustedProxies or header with it",
      );
    }
    const list = o.trustedProxies ?? [];
    if (!Array.isArray(list)) throw badOption("clientIp.trustedProxies must be an array of strings");
    for (const p of list) {
      if (typeof p !== "string") throw badOption("clientIp.trustedProxies must be an array of strings");
      const t = p.trim();
      if (t.toLowerCase() === "unix") {
        this.trustUnix = true;
        continue;
      }
      const slash = t.indexOf("/");
      const addr = parseIp(slash < 0 ? t : t.slice(0, slash));
      const bitsText = slash < 0 ? undefined : t.slice(slash + 1);
      let n: number | undefined = addr ? addr.bytes.length * 8 : undefined;
      if (bitsText !== undefined) n = /^\d{1,3}$/.test(bitsText) ? Number(bitsText) : undefined;
      if (addr && n !== undefined && slash >= 0) {
        const v6 = !parseV4(t.slice(0, slash));
        const max = v6 ? 128 : 32;
        if (n > max) n = undefined;
        else if (v6 && addr.bytes.length === 4) n = Math.max(n - 96, 0); // an IPv4-mapped network
      }
      if (!addr || n === undefined) {
        throw badOption(`trusted proxy '${t}' is not an address or network`);
      }
      this.trusted.push({ bytes: masked(addr.bytes, n), bits: n });
    }
    Object.freeze(this);
  }

  /** Whether the rule trusts some proxy (an address, a network or "unix"). */
  get trustsProxies(): boolean {
    return this.trusted.length > 0 || this.trustUnix;
  }

  /** How an address is keyed: IPv4 as is, IPv6 as its network of ipv6Prefix bits ("2001:db8::/64"; the address at 128). */
  keyOf(address: string): string | undefined {
    const a = parseIp(stripZone(address));
    if (!a) return undefined;
    return this.keyOfAddr(a);
  }

  private keyOfAddr(a: Addr): string {
    if (a.bytes.length === 4 || this.ipv6Prefix >= 128) return formatIp(a);
    return `${formatV6(masked(a.bytes, this.ipv6Prefix))}/${this.ipv6Prefix}`;
  }

  private isTrusted(a: Addr): boolean {
    return this.trusted.some((n) => contains(n, a));
  }

  /**
   * The client of a request from its socket peer (undefined: none, a Unix socket) and the
   * lines of its forwarding header (header(name) gives a header's lines).
   */
  resolve(peer: string | undefined, header: (name: string) => readonly string[]): ClientAddress {
    const p = peer === undefined || peer === "" ? undefined : parseIp(stripZone(peer));
    const [addr, unusable] = this.clientAddr(p, header);
    if (!addr) return { key: UNKNOWN_IP, unknown: true, unusable };
    return { key: this.keyOfAddr(addr), unknown: false, unusable };
  }

  /** The client from an address the framework computed (fromFramework). */
  fromAddress(address: string | undefined): ClientAddress {
    const key = address === undefined ? undefined : this.keyOf(address);
    if (key === undefined) return { key: UNKNOWN_IP, unknown: true, unusable: false };
    return { key, unknown: false, unusable: false };
  }

  private clientAddr(
    peer: Addr | undefined,
    header: (name: string) => readonly string[],
  ): [Addr | undefined, boolean] {
    const fromProxy = peer ? this.isTrusted(peer) : this.trustUnix;
    if (!fromProxy) return [peer, false];
    const lines = header(this.header);
    if (lines.length === 0) return [peer, false];
    const raw = lines.join(", ");
    const hops = this.header === "forwarded" ? forwardedFor(raw) : raw.split(",");
    let leftmost: Addr | undefined;
    for (let i = hops.length - 1; i >= 0; i--) {
      const a = entryAddr(hops[i]!);
      if (!a) return [peer, true];
      if (!this.isTrusted(a)) return [a, false];
      leftmost = a;
    }
    if (leftmost) return [leftmost, false];
    return [peer, true];
  }
}

function stripZone(s: string): string {
  const i = s.indexOf("%");
  return i < 0 ? s : s.slice(0, i);
}

/** An entry without the quotes of a quoted string; an unclosed or stray quote is unusable. */
function unquoted(text: string): string | undefined {
  const t = text.trim();
  if (!t.includes('"')) return t;
  if (t.length < 2 || !t.startsWith('"') || !t.endsWith('"')) return undefined;
  const inner = t.slice(1, -1);
  return inner.includes('"') ? undefined : inner;
}

/** The address of a forwarding entry (quotes, port and brackets off). */
function entryAddr(text: string): Addr | undefined {
  let t = unquoted(text);
  if (t === undefined) return undefined;
  if (t.startsWith("[")) {
    const end = t.indexOf("]");
    t = end < 0 ? t.slice(1) : t.slice(1, end);
  } else if (t.split(":").length === 2) t = t.slice(0, t.indexOf(":"));
  if (t.includes("%")) return undefined;
  return parseIp(t);
}

/** The for= values of an RFC 7239 Forwarded field, in order; an element without for= is "". */
function forwardedFor(value: string): string[] {
  const out: string[] = [];
  for (const element of value.split(",")) {
    let found = false;
    for (const pair of element.split(";")) {
      const p = pair.trim();
      const eq = p.indexOf("=");
      if (eq >= 0 && p.slice(0, eq).trim().toLowerCase() === "for") {
        out.push(p.slice(eq + 1).trim());
        found = true;
      }
    }
    if (!found) out.push("");
  }
  return out;
}
