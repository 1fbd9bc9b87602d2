"""Framework-neutral HTTP pieces: request info, key functions, rules, and the 429/413 reply.

The ASGI and WSGI middleware and the framework decorators all build a RequestInfo, find the
Rule that applies, make one limiter call (`check`, or `check_all` when a rule has several
limits), and turn the Decision into a status, headers and a JSON body with `respond`.

Key functions take a RequestInfo and return the key's value, or None when the limit does not
apply to this request (no API key sent, anonymous user, …):

* `client_ip(trusted_proxies, header="X-Forwarded-For")`: the client's address. The peer
  address is used unless it is one of the trusted proxies; then the chosen header is read
  from the right, skipping trusted proxies, and the first untrusted address is the client.
  Only the header your proxies write may be trusted: with `header="Forwarded"` the RFC 7239
  `for=` values are read instead, and X-Forwarded-For is ignored (and the reverse).
* `header(name, default=None)`: a request header, e.g. an API key.
* `user()`: the authenticated user, as the framework reports it.
* `route()`: the method and the matched rule's path (one limit per endpoint).
"""

from __future__ import annotations

import fnmatch
import hashlib
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from ._decision import Decision
from ._limits import Lease, Limit, non_negative

if TYPE_CHECKING:
    from .aio import AsyncLimiter
    from .client import Limiter

__all__ = [
    "KeyFunc",
    "Plan",
    "RequestInfo",
    "Rule",
    "Verdict",
    "client_ip",
    "header",
    "plan",
    "respond",
    "route",
    "safe_key_part",
    "user",
]


@dataclass(frozen=True)
class RequestInfo:
    """RequestInfo is what key functions and rules see of a request.

    `headers` has lower-case names (repeated fields joined with ", "); `peer` is the socket
    peer's address; `user` the authenticated user's id, if the framework knows one.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    peer: str | None
    user: str | None = None
    route: str | None = None
    content_length: int | None = None


KeyFunc = Callable[[RequestInfo], Union[str, None]]


# -- key functions ------------------------------------------------------------------------------


Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


def _networks(trusted: Iterable[str]) -> list[Network]:
    return [ipaddress.ip_network(t.strip(), strict=False) for t in trusted]


def _parse_addr(text: str) -> str | None:
    """_parse_addr reads an address from a forwarding header entry (port and brackets off)."""
    t = text.strip().strip('"')
    if t.startswith("["):  # [v6] or [v6]:port
        end = t.find("]")
        t = t[1:end] if end > 0 else t
    elif t.count(":") == 1:  # v4:port
        t = t.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    # A dual-stack socket reports an IPv4 client as ::ffff:a.b.c.d: key it by its IPv4
    # address, so one client has one key whichever socket it came through.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.compressed


def _forwarded_for(value: str) -> list[str]:
    """_forwarded_for extracts the `for=` values of an RFC 7239 Forwarded field, in order."""
    out: list[str] = []
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, v = pair.strip().partition("=")
            if name.strip().lower() == "for":
                out.append(v.strip())
    return out


def client_ip(
    trusted_proxies: Iterable[str] = (), *, header: str = "X-Forwarded-For"
) -> KeyFunc:
    """client_ip keys by the client's IP address, honouring `trusted_proxies` (addresses or
    CIDR networks) for `header` (`X-Forwarded-For` or `Forwarded`)."""
    nets = _networks(trusted_proxies)
    name = header.lower()
    if name not in ("x-forwarded-for", "forwarded"):
        raise ValueError("header must be X-Forwarded-For or Forwarded")

    def trusted(addr: str | None) -> bool:
        if addr is None:
            return False
        ip = ipaddress.ip_address(addr)
        return any(ip in n for n in nets)

    def key(info: RequestInfo) -> str | None:
        peer = _parse_addr(info.peer) if info.peer else None
        if peer is None:
            return info.peer
        if not nets or not trusted(peer):
            return peer
        raw = info.headers.get(name)
        if not raw:
            return peer
        hops = _forwarded_for(raw) if name == "forwarded" else raw.split(",")
        for hop in reversed(hops):
            addr = _parse_addr(hop)
            if addr is None:
                # An obfuscated or unknown hop written by a trusted proxy: stop here.
                return hop.strip().strip('"') or peer
            if not trusted(addr):
                return addr
        first = _parse_addr(hops[0]) if hops else None
        return first or peer

    return key


def header(name: str, default: str | None = None) -> KeyFunc:
    """header keys by a request header (e.g. `X-API-Key`); `default` when it is absent."""
    lower = name.lower()

    def key(info: RequestInfo) -> str | None:
        value = info.headers.get(lower)
        return value if value else default

    return key


def user() -> KeyFunc:
    """user keys by the authenticated user; anonymous requests are not limited by it."""

    def key(info: RequestInfo) -> str | None:
        return info.user

    return key


def route() -> KeyFunc:
    """route keys by method and matched route: one shared limit per endpoint."""

    def key(info: RequestInfo) -> str | None:
        return f"{info.method} {info.route or info.path}"

    return key


_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")


def safe_key_part(value: str) -> str:
    """safe_key_part makes a client-supplied value safe inside a Redis key: braces (hash
    tags), spaces and other bytes are percent-encoded, and long values are hashed."""
    if len(value) > 128:
        return "sha256:" + hashlib.sha256(value.encode()).hexdigest()
    return _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), value)


# -- rules ----------------------------------------------------------------------------------------


PathPattern = Union[str, "re.Pattern[str]"]


@dataclass
class Rule:
    """Rule limits the requests whose path matches `path` (and `methods`, if given).

    `path`: exact ("/login"), a prefix when it ends with "/" ("/api/"), a glob with "*"
    ("/users/*/avatar"), or a compiled regex. `limits`: one Limit with `key`, or a mapping
    name -> (Limit, KeyFunc) checked together in one atomic call (e.g. per API key and per
    IP). `cost`: units per request, an int or a function of the request (e.g. by size).
    `name` names the policy in the RateLimit headers (default: the limit's name, or the
    path). Keys are `<prefix><name>:<value>`; several limits share the first value as hash
    tag (`{value}:<name>:<value2>`), so the call works on a Redis Cluster.

    A rule's limits are rates (GCRA, Window): a Lease raises TypeError when the rule is
    built (take a concurrency limit with `acquire` in the handler).
    """

    path: PathPattern
    limits: Limit | Mapping[str, tuple[Limit, KeyFunc]]
    key: KeyFunc | None = None
    name: str | None = None
    methods: Sequence[str] | None = None
    cost: int | Callable[[RequestInfo], int] = 1
    _named: list[tuple[str, Limit, KeyFunc]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.limits, Mapping):
            if self.key is not None:
                raise ValueError("give key functions inside limits={name: (limit, key)}")
            self._named = [(n, lim, kf) for n, (lim, kf) in self.limits.items()]
        else:
            if self.key is None:
                raise ValueError("a Rule with one limit needs key=")
            n = self.name or self.limits.name or _path_name(self.path)
            self._named = [(n, self.limits, self.key)]
        if not self._named:
            raise ValueError("a Rule needs at least one limit")
        for n, lim, _ in self._named:
            # A rule limits request rates: checked per request, a Lease would fail every
            # request it applies to (check() refuses it, check_all wants a token).
            if isinstance(lim, Lease):
                raise TypeError(
                    f"a Rule takes a GCRA or a Window limit, not a Lease ({n!r}): take a "
                    "concurrency limit with limiter.acquire() in the handler"
                )
        if self.methods is not None:
            self.methods = [m.upper() for m in self.methods]

    def matches(self, method: str, path: str) -> bool:
        if self.methods is not None and method.upper() not in self.methods:
            return False
        return path_matches(self.path, path)


def _path_name(p: PathPattern) -> str:
    text = p if isinstance(p, str) else p.pattern
    return text.strip("/^$*").replace("/", "-") or "default"


def path_matches(pattern: PathPattern, path: str) -> bool:
    """path_matches applies a rule's or an exemption's path pattern."""
    if isinstance(pattern, re.Pattern):
        return pattern.fullmatch(path) is not None
    if "*" in pattern:
        return fnmatch.fnmatchcase(path, pattern)
    if pattern.endswith("/"):
        return path.startswith(pattern) or path == pattern.rstrip("/")
    return path == pattern


@dataclass(frozen=True)
class Plan:
    """Plan is the one limiter call a request needs."""

    rule: Rule
    keys: dict[str, Limit]  # full key -> limit, in rule order
    names: dict[str, str]  # full key -> policy name
    cost: int


def plan(
    rules: Sequence[Rule], info: RequestInfo, exempt: Sequence[PathPattern] = ()
) -> Plan | None:
    """plan finds the first rule for the request and builds its keys (None: not limited)."""
    if any(path_matches(p, info.path) for p in exempt):
        return None
    for rule in rules:
        if not rule.matches(info.method, info.path):
            continue
        return plan_rule(rule, info)
    return None


def plan_rule(rule: Rule, info: RequestInfo) -> Plan | None:
    """plan_rule builds a matched rule's keys for this request (None: no key applies)."""
    info = RequestInfo(
        info.method, info.path, info.headers, info.peer, info.user,
        info.route or (rule.path if isinstance(rule.path, str) else rule.path.pattern),
        info.content_length,
    )
    values = [(n, lim, kf(info)) for n, lim, kf in rule._named]
    present = [(n, lim, safe_key_part(v)) for n, lim, v in values if v is not None]
    if not present:
        return None
    cost = rule.cost(info) if callable(rule.cost) else rule.cost
    non_negative(cost, "cost")
    keys: dict[str, Limit] = {}
    names: dict[str, str] = {}
    if len(present) == 1:
        n, lim, v = present[0]
        k = f"{n}:{v}"
        keys[k], names[k] = lim, rule.name if (rule.name and len(rule._named) == 1) else n
    else:
        tag = present[0][2]
        for n, lim, v in present:
            k = f"{{{tag}}}:{n}:{v}"
            keys[k], names[k] = lim, n
    return Plan(rule, keys, names, cost)


@dataclass(frozen=True)
class Verdict:
    """Verdict is what to answer: `status` None lets the request through with `headers`."""

    status: int | None
    headers: dict[str, str]
    body: bytes = b""


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
    JSON body. Never allowed (cost above the limit): 413. Denied by the "closed" failure
    policy: `degraded_status` (503) with Retry-After.
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
    elif decision.degraded:
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


def _binding_name(d: Decision, names: Mapping[str, str]) -> str:
    for k, sub in d.per_key.items():
        if not sub.allowed and (sub.never or d.never) == d.never:
            return names.get(k, k)
    for k, sub in d.per_key.items():
        if sub.policy is d.policy:
            return names.get(k, k)
    return next(iter(names.values()), "default")


def decide(limiter: Limiter, p: Plan) -> Decision:
    """decide makes the plan's one call with a sync Limiter."""
    if len(p.keys) == 1:
        ((k, lim),) = p.keys.items()
        return limiter.check(k, lim, p.cost)
    return limiter.check_all(dict(p.keys), p.cost)


async def adecide(limiter: AsyncLimiter, p: Plan) -> Decision:
    """adecide makes the plan's one call with an AsyncLimiter."""
    if len(p.keys) == 1:
        ((k, lim),) = p.keys.items()
        return await limiter.check(k, lim, p.cost)
    return await limiter.check_all(dict(p.keys), p.cost)


def status_text(status: int) -> str:
    return {413: "Content Too Large", 429: "Too Many Requests", 503: "Service Unavailable"}.get(
        status, "Error"
    )


def lower_headers(pairs: Iterable[tuple[Any, Any]]) -> dict[str, str]:
    """lower_headers folds header pairs (bytes or str) into a lower-case dict."""
    out: dict[str, str] = {}
    for k, v in pairs:
        name = (k.decode("latin-1") if isinstance(k, bytes) else str(k)).lower()
        value = v.decode("latin-1") if isinstance(v, bytes) else str(v)
        out[name] = f"{out[name]}, {value}" if name in out else value
    return out
