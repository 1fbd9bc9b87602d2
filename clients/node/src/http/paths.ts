// Paths (docs/clients.md#routes): the normalised path rules and exemptions match, and the
// pattern syntax of clients/go/rlhttp/paths.go's MatchPath (the Rust layer's PathPattern, the
// Python package's exempt paths).

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

function hex(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x61 + 10;
  if (c >= 0x41 && c <= 0x46) return c - 0x41 + 10;
  return -1;
}

/** The path of a request-target as sent: the query cut off, an absolute form's authority too. */
export function targetPath(target: string): string {
  let t = target;
  const q = t.search(/[?#]/);
  if (q >= 0) t = t.slice(0, q);
  const abs = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/]*/.exec(t);
  if (abs) t = t.slice(abs[0].length);
  return t;
}

/**
 * Percent-decodes a path once (bytes that are not UTF-8 after decoding become U+FFFD, one per
 * maximal invalid subsequence, as Rust's from_utf8_lossy and Go's NormalizePath), puts a `/`
 * in front, and collapses runs of `/`.
 */
function decodeCollapse(path: string): string {
  const bytes: number[] = [];
  for (let i = 0; i < path.length; i++) {
    const c = path.charCodeAt(i);
    if (c === 0x25 && i + 2 < path.length) {
      const h = hex(path.charCodeAt(i + 1));
      const l = hex(path.charCodeAt(i + 2));
      if (h >= 0 && l >= 0) {
        bytes.push((h << 4) | l);
        i += 2;
        continue;
      }
    }
    if (c < 0x80) bytes.push(c);
    else {
      const cp = path.codePointAt(i)!;
      if (cp > 0xffff) i++;
      for (const b of Buffer.from(String.fromCodePoint(cp), "utf8")) bytes.push(b);
    }
  }
  const text = decoder.decode(Uint8Array.from(bytes));
  return ("/" + text).replace(/\/{2,}/g, "/");
}

function dropTrailing(p: string): string {
  return p.length > 1 && p.endsWith("/") ? p.slice(0, -1) : p;
}

/** RFC 3986's remove_dot_segments (5.2.4) on an absolute path. */
function removeDots(path: string): string {
  const out: string[] = [];
  const segs = path.split("/").slice(1);
  segs.forEach((s, i) => {
    const last = i === segs.length - 1;
    if (s === ".") {
      if (last) out.push("");
    } else if (s === "..") {
      out.pop();
      if (last) out.push("");
    } else out.push(s);
  });
  return "/" + out.join("/");
}

/**
 * The normalised path of a request-target: decoded once, `//` collapsed, `.` and `..`
 * segments resolved (RFC 3986 5.2.4, after decoding, so `/static/%2e%2e/api` is `/api`), no
 * trailing `/` (except the root). `/api//Things/`, `/api/%54hings` and `/x/../api/Things` all
 * give `/api/Things`. The query is not part of it.
 */
export function normalizePath(target: string): string {
  return dropTrailing(removeDots(decodeCollapse(targetPath(target))));
}

/**
 * Whether the normalised path matches pattern: a glob when the pattern holds `*` (`*` any run
 * of characters, `/` included; `?` one character; `[abc]`, `[a-z]`, `[!abc]` one of or outside
 * a set; an unclosed `[` is itself); else a prefix when it ends with `/` (`/api/` matches
 * `/api/x/y` and `/api`); else the exact path (normalised: `/health/` is `/health`).
 * Case-sensitive, on characters.
 */
export function matchPath(pattern: string, path: string): boolean {
  if (pattern.includes("*")) return glob(Array.from(pattern), Array.from(path));
  if (pattern.endsWith("/")) {
    const bare = pattern.replace(/\/+$/, "") || "/";
    return path.startsWith(pattern) || path === bare;
  }
  return path === dropTrailing(decodeCollapse(pattern));
}

function glob(p: string[], t: string[]): boolean {
  let pi = 0;
  let ti = 0;
  let starP = -1;
  let starT = -1;
  while (ti < t.length) {
    if (pi < p.length) {
      const c = p[pi]!;
      if (c === "*") {
        starP = pi;
        starT = ti;
        pi++;
        continue;
      }
      if (c === "?") {
        pi++;
        ti++;
        continue;
      }
      if (c === "[") {
        const [matched, next, closed] = inClass(p, pi, t[ti]!);
        if (closed) {
          if (matched) {
            pi = next;
            ti++;
            continue;
          }
        } else if (t[ti] === "[") {
          pi++;
          ti++;
          continue;
        }
      } else if (c === t[ti]) {
        pi++;
        ti++;
        continue;
      }
    }
    if (starP < 0) return false;
    starT++;
    pi = starP + 1;
    ti = starT;
  }
  for (; pi < p.length; pi++) if (p[pi] !== "*") return false;
  return true;
}

function inClass(p: string[], start: number, c: string): [boolean, number, boolean] {
  let i = start + 1;
  const negate = i < p.length && p[i] === "!";
  if (negate) i++;
  const first = i;
  let matched = false;
  const cp = c.codePointAt(0)!;
  while (i < p.length) {
    if (p[i] === "]" && i > first) return [matched !== negate, i + 1, true];
    if (i + 2 < p.length && p[i + 1] === "-" && p[i + 2] !== "]") {
      if (p[i]!.codePointAt(0)! <= cp && cp <= p[i + 2]!.codePointAt(0)!) matched = true;
      i += 3;
      continue;
    }
    if (p[i] === c) matched = true;
    i++;
  }
  return [false, 0, false];
}
