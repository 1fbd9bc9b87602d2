"""Framework-neutral HTTP pieces: request info, identities, rules, the decision and the answers.

Every integration (ASGI and WSGI middleware, the Starlette, FastAPI, Flask and Django
adapters) builds a RequestInfo, lets a `Gate` find the Rule that applies and plan its keys,
makes the plan's limiter calls (`decide` / `adecide`), answers with `respond`, and once the
response's status is known settles the charge (`settle` / `asettle`: `deduct_when` and a
reported cost).

Key functions take a RequestInfo and return an `Identity` (a kind and a value), a plain
string (kind "fn"), or None when the request has no such identity (no API key sent, anonymous
user), in which case the rule's `missing` policy applies:

* `client_ip(trusted_proxies, header="X-Forwarded-For", ipv6_prefix=64)`: kind "ip", the
  client's address (docs/clients.md#client-ip).
* `header(name, default=None)`: kind "hdr.<lower-case name>", a request header (an API key).
* `user()`: kind "user", the authenticated user, as the framework reports it.
* `route()`: kind "route", the method and the matched route template (one limit per endpoint).
* `custom_key(fn, kind="fn")`: any function of the request, under a kind you name.

Keys (docs/clients.md#identities-stay-apart): each limit is keyed by its own identity only,
`<prefix><limit name>:{<kind>:<value>}`, the identity in braces being the Redis Cluster hash
tag, so a client that changes one identity (its API key) never resets another's limit (its
IP's). A rule's `hash_tag` replaces the per-identity tags (`<prefix>{<hash_tag>}:<limit
name>:<kind>:<value>`), putting every key of the rule in one slot.
"""

from __future__ import annotations

import contextvars
import fnmatch
import hashlib
import ipaddress
import json
import logging
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Union

import redis
from redis.crc import key_slot

from ._decision import NEVER, Decision, RetryAfter, Source, ceil_seconds
from ._limits import GCRA, U64_MAX, Algorithm, InvalidLimit, Lease, Limit, StringAlgorithm, Window, parse_limits
from ._policy import LimiterUnavailable

if TYPE_CHECKING:
    from .aio import AsyncLimiter
    from .client import Limiter

__all__ = [
    "Check",
    "Denial",
    "Gate",
    "Identity",
    "KeyFunc",
    "LimitSpec",
    "Missing",
    "Plan",
    "RequestInfo",
    "Rule",
    "Verdict",
    "adecide",
    "asettle",
    "client_ip",
    "custom_key",
    "decide",
    "header",
    "list_value",
    "normalise_path",
    "plan",
    "report_cost",
    "respond",
    "route",
    "safe_key_part",
    "settle",
    "user",
]

log = logging.getLogger("redis_rl")


@dataclass(frozen=True)
class RequestInfo:
    """RequestInfo is what key functions, rules and predicates see of a request.

    `method` is upper case; `path` the request's path, normalised (`normalise_path`: `//`
    collapsed, no trailing `/`), so every spelling of one path meets the same rules and
    buckets; `headers` has lower-case names (repeated fields joined with ", "); `peer` is the
    socket peer's address; `user` the authenticated user's id, if the framework knows one;
    `route` the router's matched route template (`/users/{id}`) where the framework exposes
    it ("" when it is known that no route matched: a 404); `content_length` the request's
    Content-Length. `native` is the framework's own request object (the ASGI scope, the WSGI
    environ, Starlette's Request, Django's HttpRequest), for hooks that need more.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    peer: str | None
    user: str | None = None
    route: str | None = None
    content_length: int | None = None
    native: Any = field(default=None, compare=False, repr=False)


def normalise_path(path: str) -> str:
    """normalise_path collapses runs of `/`, resolves `.` and `..` segments (RFC 3986's
    remove_dot_segments; never above the root) and drops a trailing `/` (the root stays `/`):
    `/api//things/` and `/static/../api/things` are both `/api/things`. It takes the decoded
    path (ASGI's `path`, WSGI's `PATH_INFO`), so `%2e%2e` was `..` already."""
    out = re.sub(r"/{2,}", "/", path or "/")
    if not out.startswith("/"):
        out = "/" + out
    if "." in out:
        out = _remove_dot_segments(out)
    if len(out) > 1 and out.endswith("/"):
        out = out.rstrip("/") or "/"
    return out


def _remove_dot_segments(path: str) -> str:
    segments = path[1:].split("/")
    kept: list[str] = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == "..":
            if kept:
                kept.pop()
        elif seg != ".":
            kept.append(seg)
            continue
        if last:
            kept.append("")
    return "/" + "/".join(kept)


# -- identities -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """Identity is what a key function found: a `kind` ("ip", "hdr.x-api-key", "user",
    "route", or a kind the caller names) and a `value`. The kind is part of the Redis key, so
    an API key equal to an IP address never shares that IP's bucket."""

    kind: str
    value: str
    #: client_ip only: the trusted proxy's forwarding header held no usable address, so the
    #: peer address was used (counted as `forwarded_unusable`).
    unusable_forwarding: bool = False
    #: client_ip only: no usable client address was found (no peer, a peer that is not an IP
    #: address, a Unix socket without a trusted forwarding header): the value is UNKNOWN_IP,
    #: one bucket shared by every such request (counted as `peer_unknown`).
    peer_unknown: bool = False


#: A key function: the request's identity for a limit, or None when it has none.
KeyFunc = Callable[[RequestInfo], Union[Identity, str, None]]

# What may follow an address in a forwarding entry: nothing, or a port (a number, or RFC 7239's
# obfuscated port: "_" and letters, digits, ".", "_", "-"); "[2001:db8::1]junk" is unusable.
_PORT_OR_NOTHING = re.compile(r"(?::(?:[0-9]+|_[A-Za-z0-9._-]*))?")
_KIND = re.compile(r"\A[a-z0-9][a-z0-9._-]{0,63}\Z")


def _check_kind(kind: str) -> str:
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise ValueError(
            "an identity kind is 1 to 64 of a-z, 0-9, '.', '_', '-' (starting with a letter or digit)"
        )
    return kind


def identity_of(key: KeyFunc, info: RequestInfo) -> Identity | None:
    """identity_of runs a key function: an Identity, or None (a plain str is kind "fn")."""
    got = key(info)
    if got is None or isinstance(got, Identity):
        return got
    if isinstance(got, str):
        return Identity(getattr(key, "kind", "fn"), got) if got else None
    raise TypeError(f"a key function returns an Identity, a str or None, not {type(got).__name__}")


Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


def _networks(trusted: Iterable[str]) -> list[Network]:
    return [ipaddress.ip_network(t.strip(), strict=False) for t in trusted]


#: The `ip` identity of a request with no usable client address: all such requests share the
#: one bucket `<name>:{ip:unknown}` (limited together, never unlimited).
UNKNOWN_IP = "unknown"

#: The word in `trusted_proxies` that makes a peer with no IP address (a Unix socket) a
#: trusted proxy, whose forwarding header is read.
UNIX = "unix"


def _unquoted(text: str) -> str | None:
    """_unquoted is an entry without the quotes of a quoted string (RFC 7239 `for="…"`):
    quoted as a whole, or not at all; an unclosed or stray quote (`for="1.1.1.1`) makes the
    entry unusable (None)."""
    t = text.strip()
    if '"' not in t:
        return t
    if len(t) >= 2 and t[0] == t[-1] == '"' and '"' not in t[1:-1]:
        return t[1:-1]
    return None


def _parse_addr(text: str) -> Address | None:
    """_parse_addr reads an address from a peer or a forwarding header entry (quotes, port
    and brackets off); an IPv4-mapped IPv6 address is its IPv4 address. None: not an
    address (garbage, a port alone, an unclosed quote)."""
    u = _unquoted(text)
    if u is None:
        return None
    t = u
    if t.startswith("["):  # [v6] or [v6]:port
        end = t.find("]")
        if end < 0 or not _PORT_OR_NOTHING.fullmatch(t[end + 1 :]):
            return None
        t = t[1:end]
    elif t.count(":") == 1:  # v4:port (or ":port" alone: unusable)
        t, port = t.split(":", 1)
        if not _PORT_OR_NOTHING.fullmatch(":" + port):
            return None
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    # A dual-stack socket reports an IPv4 client as ::ffff:a.b.c.d: key it by its IPv4
    # address, so one client has one key whichever socket it came through.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _forwarded_for(value: str) -> list[str]:
    """_forwarded_for extracts the `for=` values of an RFC 7239 Forwarded field, in order (an
    element without one counts as an unusable entry)."""
    out: list[str] = []
    for element in value.split(","):
        found = ""
        for pair in element.split(";"):
            name, _, v = pair.strip().partition("=")
            if name.strip().lower() == "for":
                found = v.strip()
        out.append(found)
    return out


def client_ip(
    trusted_proxies: Iterable[str] = (),
    *,
    header: str = "X-Forwarded-For",
    ipv6_prefix: int = 64,
) -> KeyFunc:
    """client_ip keys by the client's IP address (kind "ip"; docs/clients.md#client-ip).

    The socket peer is the client unless it is one of `trusted_proxies` (addresses or CIDR
    networks). Then exactly one forwarding header is read, `header` ("X-Forwarded-For", or
    "Forwarded" for RFC 7239 `for=` values), never both; all its lines count (repeated lines
    are one list); the rightmost address not in the trusted set is the client (what a client
    writes at the left is ignored). A header that holds no usable address there (garbage, a
    port alone, an obfuscated `for=`, an unclosed quote, an empty list) is ignored: the peer
    address is used and the request counted as `forwarded_unusable`. IPv4-mapped IPv6 is
    IPv4. IPv6 clients are keyed by their `/ipv6_prefix` network (48 to 128; default 64, one
    allocation), so rotating addresses inside it gains nothing.

    A request with no usable client address (no peer: a Unix socket; a peer that is not an
    IP address, such as what uvicorn's proxy headers made of a forged X-Forwarded-For) is
    never unlimited and never keyed by that string: its value is `unknown`, one bucket for
    all such requests (`<name>:{ip:unknown}`), counted as `peer_unknown` and logged once by
    the middleware. The word `"unix"` among `trusted_proxies` makes such a peer (a Unix
    socket, with a proxy in front of it) a trusted proxy: its forwarding header is read as
    any trusted proxy's, and the value is `unknown` only when that header is missing or
    unusable.
    """
    given = [t.strip() for t in trusted_proxies]
    unix = any(t.lower() == UNIX for t in given)
    nets = _networks(t for t in given if t.lower() != UNIX)
    name = header.lower()
    if name not in ("x-forwarded-for", "forwarded"):
        raise ValueError("header must be X-Forwarded-For or Forwarded")
    if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int) or not 48 <= ipv6_prefix <= 128:
        raise ValueError("ipv6_prefix must be an integer from 48 to 128")

    def shown(ip: Address) -> str:
        if isinstance(ip, ipaddress.IPv6Address) and ipv6_prefix < 128:
            return str(ipaddress.IPv6Network((ip, ipv6_prefix), strict=False))
        return ip.compressed

    def trusted(ip: Address) -> bool:
        return any(ip in n for n in nets)

    def forwarded(info: RequestInfo, peer: Identity) -> Identity:
        # The peer is a trusted proxy: the rightmost untrusted address of its header, else
        # the peer's own identity (flagged when the header was unusable).
        raw = info.headers.get(name)
        if raw is None:
            return peer
        hops = _forwarded_for(raw) if name == "forwarded" else raw.split(",")
        if not any(h.strip() for h in hops):
            return replace(peer, unusable_forwarding=True)
        first: Address | None = None
        for hop in reversed(hops):
            addr = _parse_addr(hop)
            if addr is None:
                return replace(peer, unusable_forwarding=True)
            first = addr
            if not trusted(addr):
                return Identity("ip", shown(addr))
        # Every hop is a trusted proxy: the leftmost is the nearest thing to a client.
        assert first is not None
        return Identity("ip", shown(first))

    def key(info: RequestInfo) -> Identity:
        peer = _parse_addr(info.peer) if info.peer else None
        if peer is None:  # no address: a Unix socket, a server that reports none, garbage
            unknown = Identity("ip", UNKNOWN_IP, peer_unknown=True)
            return forwarded(info, unknown) if unix else unknown
        if not nets or not trusted(peer):
            return Identity("ip", shown(peer))
        return forwarded(info, Identity("ip", shown(peer)))

    key.kind = "ip"  # type: ignore[attr-defined]
    return key


def list_value(value: str) -> str:
    """list_value is a header's value as one list, spelt one way: split on ",", each element's
    optional whitespace (spaces, tabs) stripped, joined with ", ". Repeated header lines reach
    an app joined with ", " (ASGI, the Rust layer) or "," (WSGI servers), or as one line: each
    is the same value here, so one request has one key whichever server ran it."""
    return ", ".join(part.strip(" \t") for part in value.split(","))


def header(name: str, default: str | None = None) -> KeyFunc:
    """header keys by a request header (kind "hdr.<lower-case name>"), e.g. an API key.

    Its value is read as a list (`list_value`): repeated lines, or elements around ",", are
    one value spelt "a, b" whichever server joined them. A request without the header (or
    with an empty one) has no such identity (the rule's `missing` policy applies: by default
    the client IP), unless `default` is given: then every request without it shares one
    bucket under that value, as asked.
    """
    lower = name.lower()
    kind = _check_kind("hdr." + re.sub(r"[^a-z0-9._-]", "_", lower))

    def key(info: RequestInfo) -> Identity | None:
        raw = info.headers.get(lower)
        value = list_value(raw) if raw else ""
        if value:
            return Identity(kind, value)
        return Identity(kind, default) if default else None

    key.kind = kind  # type: ignore[attr-defined]
    return key


def user() -> KeyFunc:
    """user keys by the authenticated user (kind "user"); an anonymous request has no such
    identity (the rule's `missing` policy applies)."""

    def key(info: RequestInfo) -> Identity | None:
        return Identity("user", info.user) if info.user else None

    key.kind = "user"  # type: ignore[attr-defined]
    return key


def route() -> KeyFunc:
    """route keys by method and matched route (kind "route"): one shared limit per endpoint.

    The router's template (`/users/{id}`) where the framework exposes it, else the normalised
    path; requests that match no route (404s) share one bucket ("<method> (no route)")."""

    def key(info: RequestInfo) -> Identity:
        where = info.route if info.route is not None else info.path
        return Identity("route", f"{info.method} {where or '(no route)'}")

    key.kind = "route"  # type: ignore[attr-defined]
    return key


def custom_key(fn: Callable[[RequestInfo], str | None], *, kind: str = "fn") -> KeyFunc:
    """custom_key keys by any function of the request, under the identity kind `kind`
    (1 to 64 of a-z, 0-9, '.', '_', '-'; default "fn"). The function returns the value, or
    None when the request has none (the rule's `missing` policy applies)."""
    k = _check_kind(kind)

    def key(info: RequestInfo) -> Identity | None:
        value = fn(info)
        return Identity(k, value) if value else None

    key.kind = k  # type: ignore[attr-defined]
    return key


_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")


#: The most UTF-8 bytes a value keeps as itself in a key; longer ones are hashed.
_MAX_LITERAL = 128


def safe_key_part(value: str) -> str:
    """safe_key_part makes a client-supplied value safe inside a Redis key: every character
    but `A-Z a-z 0-9 . _ : @ / + = -` is percent-encoded (the bytes of its UTF-8 form, upper
    case hex: braces, spaces, control bytes, `%`, `~`), so no value can pick a hash tag; a
    value of more than 128 bytes (UTF-8) is `~sha256:<lower-case hex of the SHA-256 of its
    UTF-8 bytes>`. A literal value never starts with `~` (it is `%7E`), so no value a client
    sends can produce another value's hashed form. The Rust crate spells keys byte for byte
    the same, so services in both languages share buckets."""
    raw = value.encode()
    if len(raw) > _MAX_LITERAL:
        return "~sha256:" + hashlib.sha256(raw).hexdigest()
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), value)


# -- limits ---------------------------------------------------------------------------------

#: One limit as a rule takes it: a value, or a string in the common grammar.
LimitLike = Union[Limit, str]
#: A rule's limit: a value, a string ("10/minute; 100 per hour"), several, or a function of
#: the request returning any of those (evaluated per request: limits by plan).
LimitSpec = Union[
    LimitLike,
    Sequence[LimitLike],
    Callable[[RequestInfo], Union[LimitLike, Sequence[LimitLike]]],
]

#: What a rule does when a limit's identity is missing from the request.
Missing = Literal["ip", "deny", "skip"]
_MISSING = ("ip", "deny", "skip")


def _limits_of(spec: Any, algorithm: StringAlgorithm, where: str) -> list[Limit]:
    if isinstance(spec, str):
        limits = parse_limits(spec, algorithm)
    elif isinstance(spec, (list, tuple)):
        limits = [lim for s in spec for lim in _limits_of(s, algorithm, where)]
    else:
        limits = [spec]
    for lim in limits:
        if isinstance(lim, Lease):
            # A rule limits request rates: checked per request, a Lease would fail every
            # request it applies to (check() refuses it, check_all wants a token).
            raise TypeError(
                f"a Rule takes a GCRA or a Window limit, not a Lease ({where!r}): take a "
                "concurrency limit with limiter.acquire() in the handler"
            )
        if not hasattr(lim, "spec") or not hasattr(lim, "capacity"):
            raise TypeError(f"not a limit ({where!r}): {lim!r}")
    if not limits:
        raise ValueError(f"no limit given ({where!r})")
    return limits


def _named(base: str, limits: list[Limit], single_name: str | None) -> list[tuple[str, Limit]]:
    """_named names a spec's limits: one limit is `single_name` (or its own name, or `base`);
    several are each their own name or `<base>-<window seconds>s` (-2, -3 if equal)."""
    if len(limits) == 1:
        lim = limits[0]
        return [(single_name or lim.name or base, lim)]
    out: list[tuple[str, Limit]] = []
    seen: dict[str, int] = {}
    for lim in limits:
        w = lim.window
        n = lim.name or f"{base}-{max(1, ceil_seconds(w)) if w is not None else 0}s"
        seen[n] = seen.get(n, 0) + 1
        out.append((n if seen[n] == 1 else f"{n}-{seen[n]}", lim))
    return out


PathPattern = Union[str, "re.Pattern[str]"]


@dataclass(frozen=True)
class _Entry:
    name: str
    spec: Any  # a list of (name, Limit) when static, else the function
    key: KeyFunc
    static: bool


@dataclass
class Rule:
    """Rule limits the requests whose path matches `path` (and `methods`, if given).

    * `path`: exact ("/login"), a prefix when it ends with "/" ("/api/"), a glob with "*"
      ("/users/*/avatar"), or a compiled regex; matched against the normalised path.
    * `limits`: a limit (`GCRA`, `Window`), a string (`"10/minute"`, `"100 per hour; 1000
      per day"`, parsed by `parse_limits` with `algorithm`, SLIDING by default), a list of
      those, or a function of the request returning any of them (limits by plan), with
      `key`; or a mapping `name -> (limit, key function)` of limits on different identities
      (per API key and per IP).
    * `name` names the policy in the RateLimit fields and in the keys (default: the limit's
      name, else the path); a spec with several limits names each `<name>-<window>s`. The
      name is the bucket's name: rules that give one name to the same limit share its
      buckets, and an integration refuses rules that give it to different limits
      (`check_limit_names`); a limit computed per request should have a name of its own.
    * `cost`: units per request, an int ≥ 0 or a function of the request. A cost that can
      never pass (above a limit, or 2^64 and more) is answered 413.
    * `missing`: when a key function finds no identity: "ip" (key the limit by the client IP
      instead, apart from every other limit), "deny" (401), "skip" (do not apply this limit,
      counted as `skipped`); None takes the integration's (default "ip").
    * `exempt_when(request) -> bool`: requests it exempts make no Redis call.
    * `deduct_when(status) -> bool`: charge only responses whose status it accepts (the
      charge is taken up front and refunded once the status is known otherwise); None takes the
      integration's.
    * `hash_tag`: one hash tag for every key of the rule (one RL.ALL on a Redis Cluster too,
      at the price of one slot for them all); by default each identity is its own tag.
    * `algorithm`: the window algorithm of the rule's limit strings (or "GCRA").

    A rule's limits are rates: a Lease raises TypeError when the rule is built (take a
    concurrency limit with `acquire` in the handler). Bad limit strings raise InvalidLimit
    when the rule is built.
    """

    path: PathPattern
    limits: LimitSpec | Mapping[str, tuple[LimitSpec, KeyFunc]]
    key: KeyFunc | None = None
    name: str | None = None
    methods: Sequence[str] | None = None
    cost: int | Callable[[RequestInfo], int] = 1
    missing: Missing | None = None
    exempt_when: Callable[[RequestInfo], bool] | None = None
    deduct_when: Callable[[int], bool] | None = None
    hash_tag: str | None = None
    algorithm: StringAlgorithm = Algorithm.SLIDING
    _entries: list[_Entry] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.missing is not None and self.missing not in _MISSING:
            raise ValueError("missing must be 'ip', 'deny' or 'skip'")
        if self.hash_tag is not None and (not self.hash_tag or "{" in self.hash_tag or "}" in self.hash_tag):
            raise ValueError("hash_tag must be non-empty and hold no braces")
        if isinstance(self.cost, bool) or not (callable(self.cost) or isinstance(self.cost, int)):
            raise TypeError("cost must be an int or a function of the request")
        if isinstance(self.cost, int) and self.cost < 0:
            raise ValueError("cost must be >= 0")
        base = self.name or _path_name(self.path)
        entries: list[_Entry] = []
        if isinstance(self.limits, Mapping):
            if self.key is not None:
                raise ValueError("give key functions inside limits={name: (limit, key)}")
            for n, pair in self.limits.items():
                spec, kf = pair
                entries.append(self._entry(n, spec, kf, n))
        else:
            if self.key is None:
                raise ValueError("a Rule with one limit needs key=")
            entries.append(self._entry(base, self.limits, self.key, self.name))
        if not entries:
            raise ValueError("a Rule needs at least one limit")
        self._entries = entries
        if self.methods is not None:
            self.methods = [m.upper() for m in self.methods]

    def _entry(self, base: str, spec: Any, kf: KeyFunc, single: str | None) -> _Entry:
        if not callable(kf):
            raise TypeError(f"the key of {base!r} must be a key function")
        if callable(spec) and not hasattr(spec, "spec"):
            return _Entry(base, spec, kf, False)
        return _Entry(base, _named(base, _limits_of(spec, self.algorithm, base), single), kf, True)

    def limits_for(self, info: RequestInfo) -> list[tuple[str, Limit, KeyFunc]]:
        """limits_for gives the rule's (name, limit, key function) for a request: the static
        ones, and those its limit functions return for it."""
        out: list[tuple[str, Limit, KeyFunc]] = []
        for e in self._entries:
            if e.static:
                named = e.spec
            else:
                single = e.name if isinstance(self.limits, Mapping) else self.name
                named = _named(e.name, _limits_of(e.spec(info), self.algorithm, e.name), single)
            out += [(n, lim, e.key) for n, lim in named]
        return out

    def matches(self, method: str, path: str) -> bool:
        if self.methods is not None and method.upper() not in self.methods:
            return False
        return path_matches(self.path, path)


def _path_name(p: PathPattern) -> str:
    text = p if isinstance(p, str) else p.pattern
    return text.strip("/^$*").replace("/", "-") or "default"


def path_matches(pattern: PathPattern, path: str) -> bool:
    """path_matches applies a rule's or an exemption's path pattern to a normalised path."""
    if isinstance(pattern, re.Pattern):
        return pattern.fullmatch(path) is not None
    if "*" in pattern:
        return fnmatch.fnmatchcase(path, pattern)
    if pattern.endswith("/"):
        return path.startswith(pattern) or path == (pattern.rstrip("/") or "/")
    return path == normalise_path(pattern)


def is_preflight(info: RequestInfo) -> bool:
    """is_preflight: a CORS preflight (OPTIONS with Origin and Access-Control-Request-Method)."""
    return (
        info.method == "OPTIONS"
        and "origin" in info.headers
        and "access-control-request-method" in info.headers
    )


# -- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """Check is one limit of a planned request: the key (without the limiter's prefix), the
    limit, its name in the RateLimit fields, the units it is charged, and its hash tag."""

    key: str
    limit: Limit
    name: str
    charge: int
    tag: str


@dataclass(frozen=True)
class Plan:
    """Plan is what a request needs: its rule and its checks, in the rule's order.

    `skipped` limits had no identity under `missing="skip"`; `missing` names the limit whose
    identity is missing under `missing="deny"` (then the request is answered 401 and nothing
    is checked); `never` is set for a cost of 2^64 or more (413 without a Redis call);
    `unusable_forwarding` says the client IP came from the peer because a trusted proxy's
    forwarding header was unusable; `peer_unknown` that a limit was keyed by the client IP
    and the request had no usable client address (the shared value `unknown`).
    """

    rule: Rule
    checks: tuple[Check, ...]
    cost: int
    skipped: int = 0
    missing: str | None = None
    never: bool = False
    unusable_forwarding: bool = False
    peer_unknown: bool = False

    @property
    def keys(self) -> dict[str, Limit]:
        """keys maps each key (without the limiter's prefix) to its limit, in rule order."""
        return {c.key: c.limit for c in self.checks}

    @property
    def names(self) -> dict[str, str]:
        """names maps each key to its policy name in the RateLimit fields."""
        return {c.key: c.name for c in self.checks}


def plan(
    rules: Sequence[Rule],
    info: RequestInfo,
    exempt: Sequence[PathPattern] = (),
    *,
    missing: Missing = "ip",
    ip_key: KeyFunc | None = None,
    prefix: str = "",
) -> Plan | None:
    """plan finds the first rule for the request and builds its keys (None: not limited:
    exempt path, no rule, the rule's `exempt_when`, or no limit applies)."""
    if any(path_matches(p, info.path) for p in exempt):
        return None
    for rule in rules:
        if rule.matches(info.method, info.path):
            return plan_rule(rule, info, missing=missing, ip_key=ip_key, prefix=prefix)
    return None


_DEFAULT_IP = client_ip()


def plan_rule(
    rule: Rule,
    info: RequestInfo,
    *,
    missing: Missing = "ip",
    ip_key: KeyFunc | None = None,
    prefix: str = "",
) -> Plan | None:
    """plan_rule builds a matched rule's keys for this request (None: nothing applies)."""
    if rule.exempt_when is not None and rule.exempt_when(info):
        return None
    policy = rule.missing or missing
    raw_cost = rule.cost(info) if callable(rule.cost) else rule.cost
    if isinstance(raw_cost, bool) or not isinstance(raw_cost, int):
        raise TypeError(f"a rule's cost must be an int, not {type(raw_cost).__name__}")
    if raw_cost < 0:
        raise ValueError(f"a rule's cost must be >= 0, not {raw_cost}")
    never = raw_cost > U64_MAX
    cost = min(raw_cost, U64_MAX)
    checks: list[Check] = []
    skipped = 0
    unusable = unknown = False
    for name, lim, kf in rule.limits_for(info):
        ident = identity_of(kf, info)
        if ident is None:
            if policy == "deny":
                return Plan(rule, (), cost, skipped, missing=name)
            if policy == "skip":
                skipped += 1
                continue
            ident = identity_of(ip_key or _DEFAULT_IP, info)
            if ident is None:  # a caller's ip_key that found nothing (client_ip never does)
                skipped += 1
                continue
        unusable = unusable or ident.unusable_forwarding
        unknown = unknown or ident.peer_unknown
        kind, value = safe_key_part(ident.kind), safe_key_part(ident.value)
        n = safe_key_part(name)
        if rule.hash_tag is not None:
            tag = rule.hash_tag
            key = f"{prefix}{{{tag}}}:{n}:{kind}:{value}"
        else:
            tag = f"{kind}:{value}"
            key = f"{prefix}{n}:{{{tag}}}"
        checks.append(Check(key, lim, name, cost, tag))
    if not checks:
        return Plan(rule, (), cost, skipped, unusable_forwarding=unusable, peer_unknown=unknown) if skipped else None
    return Plan(
        rule, tuple(checks), cost, skipped, never=never, unusable_forwarding=unusable,
        peer_unknown=unknown,
    )


# -- deciding -------------------------------------------------------------------------------


def _is_cluster(client: Any) -> bool:
    import redis.asyncio as aredis

    return isinstance(client, (redis.RedisCluster, aredis.RedisCluster))


def slot_groups(limiter: Limiter | AsyncLimiter, p: Plan) -> list[list[Check]]:
    """slot_groups splits a plan's checks into the calls they need: one group on a single
    server (one RL.ALL); on a Cluster client, one group per hash slot (CRC16 of the key's
    hash tag, computed here as Redis computes it), in the rule's order."""
    if not _is_cluster(limiter.redis) or len(p.checks) == 1:
        return [list(p.checks)]
    groups: dict[int, list[Check]] = {}
    for c in p.checks:
        groups.setdefault(key_slot(limiter.full_key(c.key).encode()), []).append(c)
    return list(groups.values())


def _never(limiter: Limiter | AsyncLimiter, p: Plan) -> Decision:
    """_never is the 413 of a cost too large for 64 bits: decided here, no Redis call."""
    per = {
        limiter.full_key(c.key): Decision(
            allowed=False, limit=c.limit.capacity, remaining=0, retry_after=NEVER,
            reset_after=timedelta(0), source=Source.LOCAL, policy=c.limit,
            key=limiter.full_key(c.key), blind=True,
        )
        for c in p.checks
    }
    first = next(iter(per.values()))
    d = replace(first, key=None, per_key=MappingProxyType(per) if len(per) > 1 else first.per_key)
    limiter.counters.count_decision(d)
    return d


def combine(per: Sequence[tuple[Decision, int]]) -> Decision:
    """combine builds a combined decision from per-limit decisions and their charges, as
    RL.ALL builds its reply (docs/reference.md#r-all-3, #r-cost-3): allowed when every
    charged limit allows; the binding limit's `limit` and `remaining`; the largest retry
    among the denying limits (NEVER if one can never pass); the largest reset."""
    any_charged = any(c > 0 for _, c in per)
    taking = [(d, c) for d, c in per if c > 0 or not any_charged]
    binding: Decision | None = None
    best: tuple[int, int, int] | None = None
    for i, (d, c) in enumerate(taking):
        rank = (d.remaining // c if c > 0 else d.remaining, d.remaining, i)
        if best is None or rank < best:
            best, binding = rank, d
    allowed = all(d.allowed for d, _ in taking)
    retry: RetryAfter = timedelta(0)
    if not allowed:
        if any(d.never for d, _ in taking):
            retry = NEVER
        else:
            retry = max(
                (d.retry_after for d, _ in taking if not d.allowed and isinstance(d.retry_after, timedelta)),
                default=timedelta(milliseconds=1),
            )
    decisions = [d for d, _ in per]
    degraded = any(d.degraded for d in decisions)
    return Decision(
        allowed=allowed,
        limit=binding.limit if binding else 0,
        remaining=binding.remaining if binding else 0,
        retry_after=retry,
        reset_after=max((d.reset_after for d, _ in taking), default=timedelta(0)),
        degraded=degraded,
        source=Source.LOCAL if degraded else decisions[0].source,
        policy=binding.policy if binding else None,
        per_key=MappingProxyType({d.key or str(i): d for i, d in enumerate(decisions)}),
        blind=any(d.blind for d in decisions),
    )


def _flatten(d: Decision, checks: list[Check], full: Callable[[str], str]) -> list[Decision]:
    if len(checks) == 1:
        return [d.per_key.get(full(checks[0].key), d) if d.per_key else d]
    return [d.per_key[full(c.key)] for c in checks]


def _group_args(g: list[Check]) -> dict[str, tuple[Limit, int]]:
    return {c.key: (c.limit, c.charge) for c in g}


def decide(limiter: Limiter, p: Plan) -> Decision:
    """decide makes the plan's limiter calls with a sync Limiter: one RL.ALL when its keys
    share a slot (always on a single server); on a Cluster otherwise one call per slot group
    in the rule's order, refunding what earlier groups took when a later one denies."""
    if p.never:
        return _never(limiter, p)
    groups = slot_groups(limiter, p)
    if len(groups) == 1:
        g = groups[0]
        if len(g) == 1:
            return limiter.check(g[0].key, g[0].limit, g[0].charge)
        return limiter.check_all(_group_args(g), p.cost)
    cached = _known_denied(limiter, groups, p.cost)
    if cached is not None:
        g = groups[cached]
        return limiter.check_all(_group_args(g), p.cost) if len(g) > 1 else limiter.check(g[0].key, g[0].limit, g[0].charge)
    per: list[tuple[Decision, int]] = []
    charged: list[tuple[list[Check], Decision]] = []
    denied = False
    for g in groups:
        if denied:  # the rest is evaluated without consuming, for the combined decision
            d = limiter.check_all(_group_args(g), p.cost, peek=True)
        elif len(g) == 1:
            d = limiter.check(g[0].key, g[0].limit, g[0].charge)
        else:
            d = limiter.check_all(_group_args(g), p.cost)
        per += zip(_flatten(d, g, limiter.full_key), [c.charge for c in g])
        if not denied and not d.allowed:
            denied = True
            for earlier, ed in charged:
                _refund_group(limiter, earlier, ed)
        elif not denied:
            charged.append((g, d))
    return combine(per)


async def adecide(limiter: AsyncLimiter, p: Plan) -> Decision:
    """adecide is `decide` with an AsyncLimiter."""
    if p.never:
        return _never(limiter, p)
    groups = slot_groups(limiter, p)
    if len(groups) == 1:
        g = groups[0]
        if len(g) == 1:
            return await limiter.check(g[0].key, g[0].limit, g[0].charge)
        return await limiter.check_all(_group_args(g), p.cost)
    cached = _known_denied(limiter, groups, p.cost)
    if cached is not None:
        g = groups[cached]
        if len(g) > 1:
            return await limiter.check_all(_group_args(g), p.cost)
        return await limiter.check(g[0].key, g[0].limit, g[0].charge)
    per: list[tuple[Decision, int]] = []
    charged: list[tuple[list[Check], Decision]] = []
    denied = False
    for g in groups:
        if denied:
            d = await limiter.check_all(_group_args(g), p.cost, peek=True)
        elif len(g) == 1:
            d = await limiter.check(g[0].key, g[0].limit, g[0].charge)
        else:
            d = await limiter.check_all(_group_args(g), p.cost)
        per += zip(_flatten(d, g, limiter.full_key), [c.charge for c in g])
        if not denied and not d.allowed:
            denied = True
            for earlier, ed in charged:
                await _arefund_group(limiter, earlier, ed)
        elif not denied:
            charged.append((g, d))
    return combine(per)


def _known_denied(limiter: Limiter | AsyncLimiter, groups: list[list[Check]], cost: int) -> int | None:
    """_known_denied is the index of a slot group the local deny cache already denies (its
    call answers without a round trip, and charging the others first would cost two)."""
    for i, g in enumerate(groups):
        if limiter.knows_denied(_group_args(g), cost):
            return i
    return None


def _refunds_of(
    limiter: Limiter | AsyncLimiter, checks: list[Check], d: Decision
) -> list[tuple[Decision, int]]:
    """_refunds_of is a slot group's give-backs: each check's own decision (where its charge
    was taken: Redis, or the failure policy "local"'s memory) and its charge."""
    if d.blind or not d.allowed:
        return []  # nothing was charged (failure policy "open", or denied)
    per = _flatten(d, checks, limiter.full_key)
    return [(pd, c.charge) for c, pd in zip(checks, per) if c.charge > 0]


def _refund_group(limiter: Limiter, checks: list[Check], d: Decision) -> None:
    for pd, n in _refunds_of(limiter, checks, d):
        _guard(lambda: limiter.refund_decision(pd, n))


async def _arefund_group(limiter: AsyncLimiter, checks: list[Check], d: Decision) -> None:
    for pd, n in _refunds_of(limiter, checks, d):
        await _aguard(lambda: limiter.refund_decision(pd, n))


def decision_of(limiter: Limiter | AsyncLimiter, d: Decision, key: str) -> Decision:
    """decision_of is the decision that took the charge of one of a plan's checks (`key` as
    the rule made it, without the limiter's prefix): the per-key decision of a combined one,
    else `d` itself (a plan of one check)."""
    return d.per_key.get(limiter.full_key(key), d) if d.per_key else d


def _guard(call: Callable[[], Any]) -> None:
    try:
        call()
    except (LimiterUnavailable, redis.ResponseError) as e:
        log.warning("redis-rl: settling a request's charge failed: %s", e)


async def _aguard(call: Callable[[], Awaitable[Any]]) -> None:
    try:
        await call()
    except (LimiterUnavailable, redis.ResponseError) as e:
        log.warning("redis-rl: settling a request's charge failed: %s", e)


# -- a reported cost beyond the arithmetic -------------------------------------------------

_DAY_NS = 86_400 * 10**9
_told_overflow: weakref.WeakSet[Any] = weakref.WeakSet()


def _is_overflow(e: BaseException) -> bool:
    return isinstance(e, redis.ResponseError) and str(e).startswith("arithmetic overflow")


def _most_forceable(lim: Limit, now: Decision, n: int) -> int:
    """_most_forceable is, after FORCE n overflowed, the most a FORCE can record on the key as
    a PEEK (`now`) shows it (docs/reference.md#r-force-5): GCRA, the units whose time fits
    before the end of 64-bit nanoseconds once the bucket's backlog (reset_after) is counted,
    with a day to spare for the clocks; FIXED and SLIDING, what fits under 2^64 − 1 on top of
    the count (known while the window is not full, with the limit's worth to spare; else
    half of `n`)."""
    if isinstance(lim, GCRA):
        backlog_ns = now.reset_after // timedelta(microseconds=1) * 1000
        room = U64_MAX - time.time_ns() - backlog_ns - _DAY_NS
        return max(0, room // lim.emission_interval_ns)
    if now.remaining > 0:
        return max(0, U64_MAX - (lim.capacity - now.remaining) - lim.capacity)
    return n // 2


def _overflowed(limiter: Limiter | AsyncLimiter, key: str, n: int, recorded: int) -> None:
    limiter.counters.add("errors")
    if limiter not in _told_overflow:
        _told_overflow.add(limiter)
        log.warning(
            "redis-rl: a reported cost on %r is beyond what its limit's arithmetic holds (FORCE %d "
            "would pass 64-bit time or count): recorded %d, the most it holds; counted in errors "
            "(logged once)", limiter.full_key(key), n, recorded,
        )


def _force(limiter: Limiter, key: str, lim: Limit, n: int) -> None:
    """_force records a reported cost's extra with FORCE; one beyond the limit's arithmetic
    (an overflow) records the most it can hold instead, so the key is used up as far as it
    can be, never left as if the extra had not happened."""
    try:
        limiter.force(key, lim, n)
        return
    except (LimiterUnavailable, redis.ResponseError) as e:
        if not _is_overflow(e):
            log.warning("redis-rl: settling a request's charge failed: %s", e)
            return
    try:
        m = min(n - 1, _most_forceable(lim, limiter.check(key, lim, 0, peek=True), n))
        if m > 0:
            limiter.force(key, lim, m)
        _overflowed(limiter, key, n, max(m, 0))
    except (LimiterUnavailable, redis.ResponseError) as e:
        _overflowed(limiter, key, n, 0)
        if not _is_overflow(e):
            log.warning("redis-rl: settling a request's charge failed: %s", e)


async def _aforce(limiter: AsyncLimiter, key: str, lim: Limit, n: int) -> None:
    """_aforce is `_force` with an AsyncLimiter."""
    try:
        await limiter.force(key, lim, n)
        return
    except (LimiterUnavailable, redis.ResponseError) as e:
        if not _is_overflow(e):
            log.warning("redis-rl: settling a request's charge failed: %s", e)
            return
    try:
        m = min(n - 1, _most_forceable(lim, await limiter.check(key, lim, 0, peek=True), n))
        if m > 0:
            await limiter.force(key, lim, m)
        _overflowed(limiter, key, n, max(m, 0))
    except (LimiterUnavailable, redis.ResponseError) as e:
        _overflowed(limiter, key, n, 0)
        if not _is_overflow(e):
            log.warning("redis-rl: settling a request's charge failed: %s", e)


# -- once the status is known: deduct_when and the reported cost ---------------------------


class _Charge:
    """_Charge is the current request's reported cost (set by `report_cost`)."""

    __slots__ = ("cost", "parent")

    def __init__(self, parent: _Charge | None) -> None:
        self.cost: int | None = None
        self.parent = parent


_current: contextvars.ContextVar[_Charge | None] = contextvars.ContextVar("redis_rl_charge", default=None)


def open_charge() -> tuple[_Charge, contextvars.Token[_Charge | None]]:
    """open_charge starts the reported-cost slot of a limited request (for integrations)."""
    charge = _Charge(_current.get())
    return charge, _current.set(charge)


def close_charge(token: contextvars.Token[_Charge | None]) -> None:
    try:
        _current.reset(token)
    except ValueError:  # reset from another context (a framework that switched threads)
        pass


def report_cost(cost: int) -> None:
    """report_cost tells the limiter the true cost of the request being handled (e.g. the
    tokens a model call used), from inside the handler of a limited request.

    When the response's status is known, the charge taken up front is settled to it: less
    than charged is refunded (RL.REFUND), more is recorded with FORCE (GCRA, FIXED, SLIDING; a LOG limit
    cannot record usage after the fact, so its extra is not recorded). `cost` is an int ≥ 0
    (above 2^64 − 1 it counts as 2^64 − 1); an extra beyond what the limit's arithmetic
    holds (a GCRA time past 64-bit nanoseconds, a window count past 2^64 − 1) records the
    most it holds instead, and is counted in `errors`. The frameworks' own places do the same:
    `request.state.rate_limit_cost` (Starlette, FastAPI), `flask.g.rate_limit_cost`,
    `request.rate_limit_cost` (Django), `environ["redis_rl.cost"]` (WSGI).
    Raises LookupError outside a limited request, ValueError for a bad cost.
    """
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
        raise ValueError("a reported cost must be an int >= 0")
    charge = _current.get()
    if charge is None:
        raise LookupError("report_cost() is for the handler of a request a redis_rl limit applies to")
    while charge is not None:
        charge.cost = cost
        charge = charge.parent


def reported_cost(charge: _Charge | None, *places: Any) -> int | None:
    """reported_cost is the handler's reported cost: report_cost's, else the first of the
    framework's places that holds an int."""
    if charge is not None and charge.cost is not None:
        return charge.cost
    for v in places:
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return None


def settlement(
    p: Plan, d: Decision, status: int | None, reported: int | None,
    deduct_when: Callable[[int], bool] | None,
) -> tuple[list[tuple[str, int]], list[tuple[str, Limit, int]]]:
    """settlement is what to do once the response's status is known: (refunds, forces),
    each per key.

    Nothing for a request that was not charged (denied, or admitted by the failure policy
    "open"), nor for one whose client went away before a status was sent (`status` None: it
    stays charged). `deduct_when(status)` false: every charge is refunded. Else a reported
    cost below the charge refunds the difference, above it FORCEs the extra (not on LOG).
    """
    if status is None or not d.allowed or d.blind or not p.checks:
        return [], []
    deduct = p.rule.deduct_when or deduct_when
    if deduct is not None and not deduct(status):
        return [(c.key, c.charge) for c in p.checks if c.charge > 0], []
    if reported is None:
        return [], []
    reported = min(reported, U64_MAX)
    refunds = [(c.key, c.charge - reported) for c in p.checks if reported < c.charge]
    forces = [
        (c.key, c.limit, reported - c.charge)
        for c in p.checks
        if reported > c.charge
        and not (isinstance(c.limit, Window) and c.limit.algorithm is Algorithm.LOG)
    ]
    return refunds, forces


def settle(
    limiter: Limiter, p: Plan, d: Decision, status: int | None, reported: int | None,
    deduct_when: Callable[[int], bool] | None = None,
) -> None:
    """settle carries out `settlement` with a sync Limiter (errors are logged: the response
    has gone)."""
    refunds, forces = settlement(p, d, status, reported, deduct_when)
    for key, n in refunds:
        # Each limit's charge goes back where its own decision took it (Redis, or the
        # failure policy "local"'s memory, also once Redis answers again).
        kd = decision_of(limiter, d, key)
        _guard(lambda: limiter.refund_decision(kd, n))
    for key, lim, n in forces:
        _force(limiter, key, lim, n)


async def asettle(
    limiter: AsyncLimiter, p: Plan, d: Decision, status: int | None, reported: int | None,
    deduct_when: Callable[[int], bool] | None = None,
) -> None:
    """asettle is `settle` with an AsyncLimiter."""
    refunds, forces = settlement(p, d, status, reported, deduct_when)
    for key, n in refunds:
        kd = decision_of(limiter, d, key)
        await _aguard(lambda: limiter.refund_decision(kd, n))
    for key, lim, n in forces:
        await _aforce(limiter, key, lim, n)


# -- answers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Verdict is what to answer: `status` None lets the request through with `headers`."""

    status: int | None
    headers: dict[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Denial:
    """Denial is a request the limiter does not let through, as an `on_denied` hook sees it.

    * `status`: 429 (rate limited), 413 (can never pass), 503 (failure policy "closed"),
      401 (an identity required by `missing="deny"` is missing).
    * `error`: "rate_limited", "request_too_large", "limiter_unavailable",
      "identity_required".
    * `headers`: Retry-After and the RateLimit fields (kept on a custom response unless the
      hook sets them itself), and Content-Type for `body`.
    * `body`: the package's JSON body; `decision`: the Decision (None for a 401); `policy`:
      the name of the binding limit; `request`: the RequestInfo.
    """

    status: int
    error: str
    headers: dict[str, str]
    body: bytes
    decision: Decision | None
    policy: str | None
    request: RequestInfo

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.status, self.headers, self.body)

    @property
    def limit_headers(self) -> dict[str, str]:
        """limit_headers is Retry-After and the RateLimit fields alone (no Content-Type)."""
        return {k: v for k, v in self.headers.items() if k.lower() != "content-type"}


_ERRORS = {413: "request_too_large", 429: "rate_limited", 401: "identity_required"}


def respond(
    decision: Decision,
    names: Mapping[str, str],
    *,
    x_headers: bool = False,
    degraded_status: int = 503,
    prefix: str = "",
) -> Verdict:
    """respond turns a decision into the HTTP answer.

    Allowed: pass, with the RateLimit fields. Denied: 429 with Retry-After, the fields and a
    JSON body. Never allowed (a cost above the limit): 413. Denied by the "closed" failure
    policy: `degraded_status` (503) with Retry-After. `prefix` is the limiter's key prefix
    (the decision's keys carry it, `names` do not).
    """
    full_names = {prefix + k: v for k, v in names.items()}
    if decision.per_key:
        headers = decision.headers(names=full_names, x_headers=x_headers)
        policy = _binding_name(decision, full_names)
    else:
        policy = next(iter(full_names.values()), None) or "default"
        headers = decision.headers(policy, x_headers=x_headers)
    if decision.allowed:
        return Verdict(None, headers)
    body: dict[str, object]
    if decision.never:
        status, body = 413, {
            "error": "request_too_large",
            "message": "this request asks for more than the limit allows and can never pass",
            "policy": policy,
        }
    elif decision.degraded and decision.blind:
        status, body = degraded_status, {
            "error": "limiter_unavailable",
            "message": "the rate limiter is unavailable; retry shortly",
            "retry_after": int(headers.get("Retry-After", "1")),
        }
    else:
        status, body = 429, {
            "error": "rate_limited",
            "message": "too many requests",
            "policy": policy,
            "retry_after": int(headers.get("Retry-After", "1")),
        }
    headers["Content-Type"] = "application/json"
    return Verdict(status, headers, json.dumps(body).encode())


def identity_required(name: str) -> Verdict:
    """identity_required is the 401 of a request missing an identity under missing="deny"."""
    body = {
        "error": "identity_required",
        "message": "this request must identify itself (e.g. with an API key) to be served",
        "policy": name,
    }
    return Verdict(401, {"Content-Type": "application/json"}, json.dumps(body).encode())


def _binding_name(d: Decision, names: Mapping[str, str]) -> str:
    for k, sub in d.per_key.items():
        if not sub.allowed and (sub.never or d.never) == d.never:
            return names.get(k, k)
    for k, sub in d.per_key.items():
        if sub.policy is d.policy:
            return names.get(k, k)
    return next(iter(names.values()), "default")


def status_text(status: int) -> str:
    return {
        401: "Unauthorized", 413: "Content Too Large", 429: "Too Many Requests",
        503: "Service Unavailable",
    }.get(status, "Error")


def lower_headers(pairs: Iterable[tuple[Any, Any]]) -> dict[str, str]:
    """lower_headers folds header pairs (bytes or str) into a lower-case dict; repeated
    fields are joined with ", " (one list, as HTTP reads them)."""
    out: dict[str, str] = {}
    for k, v in pairs:
        name = (k.decode("latin-1") if isinstance(k, bytes) else str(k)).lower()
        value = v.decode("latin-1") if isinstance(v, bytes) else str(v)
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def merge_headers(own: Iterable[tuple[str, str]], ours: Mapping[str, str]) -> list[tuple[str, str]]:
    """merge_headers adds `ours` to a response's headers, except those it sets itself (a
    custom denial response keeps the RateLimit fields unless it replaced them)."""
    pairs = list(own)
    present = {k.lower() for k, _ in pairs}
    return pairs + [(k, v) for k, v in ours.items() if k.lower() not in present]


# -- the gate: what every integration shares ------------------------------------------------


def _rule_label(rule: Rule) -> str:
    path = rule.path if isinstance(rule.path, str) else rule.path.pattern
    methods = f" {'|'.join(rule.methods)}" if rule.methods else ""
    return f"Rule({path!r}{methods}" + (f", name={rule.name!r})" if rule.name else ")")


def check_limit_names(rules: Sequence[Rule]) -> None:
    """check_limit_names refuses rules that give one limit name to two different limits.

    A limit's name is its bucket's name (`<name>:{<kind>:<value>}`): two rules that name a
    limit "ip" share the bucket of each client IP. That is how one global per-IP limit is
    shared by several rules, when it is the same limit in each; with different limits, one
    rule's traffic would deny the other's at once (or, with two algorithms on one key, the
    server would answer an error). Limits a function computes per request cannot be checked
    here: give them names no other rule uses. Raises ValueError naming both rules.
    """
    seen: dict[str, tuple[Rule, Limit]] = {}
    for rule in rules:
        for entry in rule._entries:
            if not entry.static:
                continue
            for name, lim in entry.spec:
                first = seen.setdefault(name, (rule, lim))
                if first[1].spec() != lim.spec():
                    raise ValueError(
                        f"the limit name {name!r} is given to two different limits: "
                        f"{' '.join(first[1].spec())} in {_rule_label(first[0])} and "
                        f"{' '.join(lim.spec())} in {_rule_label(rule)}; a limit's name is its "
                        f"bucket's name (keys {name}:{{<identity>}}), so these rules would share "
                        "buckets: give each limit its own name (or the same limit, to share one "
                        "on purpose)"
                    )

#: An `on_denied` hook: given the Denial, returns the framework's response (or None for the
#: package's own answer).
OnDenied = Callable[[Denial], Any]


class Gate:
    """Gate is the configuration every integration takes, and the steps they share.

    * `rules`: the rules, first match wins.
    * `exempt`: path patterns never limited; `exempt_when(request) -> bool`: a predicate;
      `exempt_preflight`: CORS preflights (OPTIONS with Origin and
      Access-Control-Request-Method) are exempt unless this is False. Exempt requests make
      no Redis call and get no RateLimit fields.
    * `deduct_when(status) -> bool`: the default of the rules' `deduct_when`.
    * `missing`: the default of the rules' `missing` ("ip", "deny" or "skip").
    * `x_headers`: add X-RateLimit-Limit/-Remaining/-Reset.
    * `trusted_proxies`, `forwarded_header`, `ipv6_prefix`: how the client IP is read where a
      rule keys a missing identity by it (`missing="ip"`); see `client_ip` (`"unix"` trusts
      a peer without an IP address, a Unix socket, as a proxy).
    * `on_denied(denial) -> response`: answer denials yourself (the framework's response
      type); None from it, or no hook, gives the package's JSON answer.
    * `degraded_status`: the status of a "closed" failure-policy denial (503).
    * `prefix`: put before every key of these rules (after the limiter's own prefix), e.g. to
      keep two apps' buckets apart; no braces.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        exempt: Sequence[PathPattern] = (),
        exempt_when: Callable[[RequestInfo], bool] | None = None,
        deduct_when: Callable[[int], bool] | None = None,
        missing: Missing = "ip",
        x_headers: bool = False,
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "X-Forwarded-For",
        ipv6_prefix: int = 64,
        on_denied: OnDenied | None = None,
        degraded_status: int = 503,
        prefix: str = "",
        exempt_preflight: bool = True,
    ) -> None:
        if missing not in _MISSING:
            raise ValueError("missing must be 'ip', 'deny' or 'skip'")
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}' (it would become the hash tag)")
        self.rules = list(rules)
        check_limit_names(self.rules)
        self.exempt = list(exempt)
        self.exempt_when = exempt_when
        self.deduct_when = deduct_when
        self.missing: Missing = missing
        self.x_headers = x_headers
        self.ip_key = client_ip(trusted_proxies, header=forwarded_header, ipv6_prefix=ipv6_prefix)
        self.on_denied = on_denied
        self.degraded_status = degraded_status
        self.prefix = prefix
        self.exempt_preflight = exempt_preflight
        self._told_unknown = False

    def plan(self, info: RequestInfo, rule: Rule | None = None) -> Plan | None:
        """plan is the request's plan under these rules (or one `rule`), None when exempt or
        not limited."""
        if self.exempt_preflight and is_preflight(info):
            return None
        if self.exempt_when is not None and self.exempt_when(info):
            return None
        if rule is not None:
            if any(path_matches(p, info.path) for p in self.exempt):
                return None
            return plan_rule(rule, info, missing=self.missing, ip_key=self.ip_key, prefix=self.prefix)
        return plan(self.rules, info, self.exempt, missing=self.missing, ip_key=self.ip_key, prefix=self.prefix)

    def count(self, limiter: Limiter | AsyncLimiter, p: Plan, peer: str | None = None) -> None:
        """count bumps the plan's counters (skipped, missing_denied, forwarded_unusable,
        peer_unknown); the first request without a usable client address is logged."""
        if p.skipped:
            limiter.counters.add("skipped", p.skipped)
        if p.missing is not None:
            limiter.counters.add("missing_denied")
        if p.unusable_forwarding:
            limiter.counters.add("forwarded_unusable")
        if p.peer_unknown:
            limiter.counters.add("peer_unknown")
            if not self._told_unknown:
                self._told_unknown = True
                log.warning(
                    "redis-rl: a request has no usable client address (peer %s): its IP-keyed "
                    "limits count it in the one bucket 'ip:unknown' shared by every such request "
                    "(limited together, never unlimited; counted as peer_unknown, logged once). "
                    "Fix the deployment: behind a proxy on a Unix socket, pass "
                    "trusted_proxies=[\"unix\"] so its X-Forwarded-For (or Forwarded) is read; "
                    "else have the server report the peer's address (uvicorn rewrites it from "
                    "X-Forwarded-For: run it with --no-proxy-headers and give redis_rl "
                    "trusted_proxies, or let uvicorn resolve it and give redis_rl none)",
                    repr(peer) if peer else "none (a Unix socket?)",
                )

    def verdict(self, limiter: Limiter | AsyncLimiter, p: Plan, d: Decision) -> Verdict:
        return respond(
            d, p.names, x_headers=self.x_headers, degraded_status=self.degraded_status,
            prefix=limiter.prefix,
        )

    def denial(self, v: Verdict, d: Decision | None, info: RequestInfo) -> Denial:
        assert v.status is not None
        body = json.loads(v.body) if v.body else {}
        error = str(body.get("error") or _ERRORS.get(v.status, "limiter_unavailable"))
        policy = body.get("policy")
        return Denial(v.status, error, dict(v.headers), v.body, d, policy, info)
