"""ASGI middleware (FastAPI, Starlette, any ASGI app), with an AsyncLimiter.

    app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[
        Rule("/api/", "100/minute", key=header("X-API-Key")),
    ], exempt=["/health"])

Admitted requests pass with the RateLimit fields added to the response; denied ones get 429
with Retry-After, the fields and a JSON body (or what `on_denied` returns); a request that can
never pass gets 413; a "closed" failure-policy denial gets 503 with Retry-After; a request
missing an identity under `missing="deny"` gets 401. No dependency beyond the ASGI spec.

The app sees the decision of an admitted request in `scope["state"]["rate_limit"]`, which
Starlette and FastAPI read as `request.state.rate_limit` (a `Decision`; absent when no rule
or key applied). A handler reports the request's true cost with `redis_rl.http.report_cost(n)`
or `request.state.rate_limit_cost = n`; with `deduct_when`, the charge is settled on the
status actually sent (docs/clients.md#deduct_when), before the response goes on.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from .aio import AsyncLimiter
from .http import (
    Gate,
    Missing,
    OnDenied,
    PathPattern,
    RequestInfo,
    Rule,
    Verdict,
    adecide,
    asettle,
    close_charge,
    identity_required,
    lower_headers,
    merge_headers,
    normalise_path,
    open_charge,
    reported_cost,
)

__all__ = ["RateLimitMiddleware", "request_info"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def default_user(scope: Scope) -> str | None:
    """default_user reads Starlette's `scope["user"]` (AuthenticationMiddleware)."""
    u = scope.get("user")
    if u is None or not getattr(u, "is_authenticated", False):
        return None
    ident = getattr(u, "identity", None) or getattr(u, "display_name", None)
    return str(ident) if ident else None


def route_template(scope: Scope) -> str | None:
    """route_template is the matched route's template (`/users/{id}`) of a Starlette or
    FastAPI app, "" when its router matches no route (a 404), None when the app has no
    router this can read (then rules key on the normalised path)."""
    route = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return str(route.path)
    app = scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", None) or getattr(app, "routes", None)
    if not routes:
        return None
    partial: str | None = None
    for r in routes:
        try:
            match, _ = r.matches(scope)
        except Exception:  # a route type this cannot match outside its router
            continue
        name = getattr(match, "name", "")
        path = getattr(r, "path", None)
        if name == "FULL":
            return str(path or "")
        if name == "PARTIAL" and partial is None:  # the path matches, not the method (405)
            partial = str(path or "")
    return partial if partial is not None else ""


def request_info(scope: Scope, user: Callable[[Scope], str | None] = default_user) -> RequestInfo:
    """request_info builds a RequestInfo from an ASGI HTTP scope."""
    headers = lower_headers(scope.get("headers") or [])
    client = scope.get("client")
    length = headers.get("content-length")
    return RequestInfo(
        method=str(scope.get("method", "GET")).upper(),
        path=normalise_path(str(scope.get("path", "/"))),
        headers=headers,
        peer=str(client[0]) if client else None,
        user=user(scope),
        route=route_template(scope),
        content_length=int(length) if length and length.isdigit() else None,
        native=scope,
    )


def _raw(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def send_verdict(send: Send, v: Verdict) -> None:
    """send_verdict answers a denied request with the package's answer."""
    assert v.status is not None
    headers = _raw(v.headers.items())
    headers.append((b"content-length", str(len(v.body)).encode()))
    await send({"type": "http.response.start", "status": v.status, "headers": headers})
    await send({"type": "http.response.body", "body": v.body})


async def deny(
    gate: Gate, scope: Scope, receive: Receive, send: Send, v: Verdict, d: Any, info: RequestInfo
) -> None:
    """deny answers a denial: `on_denied`'s response (an ASGI app, such as a Starlette
    Response, or a Verdict), with Retry-After and the RateLimit fields added where it did not
    set them; else the package's JSON answer."""
    if gate.on_denied is not None:
        denial = gate.denial(v, d, info)
        resp = gate.on_denied(denial)
        if inspect.isawaitable(resp):
            resp = await resp
        if isinstance(resp, Verdict):
            await send_verdict(send, Verdict(resp.status or v.status, dict(merge_headers(resp.headers.items(), denial.limit_headers)), resp.body))
            return
        if resp is not None:
            ours = denial.limit_headers

            async def send_merged(message: Message) -> None:
                if message.get("type") == "http.response.start":
                    message = dict(message)
                    own = [(k.decode("latin-1"), val.decode("latin-1")) for k, val in message.get("headers", [])]
                    message["headers"] = _raw(merge_headers(own, ours))
                await send(message)

            await resp(scope, receive, send_merged)
            return
    await send_verdict(send, v)


class RateLimitMiddleware:
    """RateLimitMiddleware limits an ASGI app's HTTP requests by `rules` (first match wins).

    `user`: how to read the authenticated user from the scope (default: Starlette's
    scope["user"]). The other parameters are those of every integration (see
    `redis_rl.http.Gate`): `exempt`, `exempt_when`, `deduct_when`, `missing`, `x_headers`,
    `trusted_proxies`, `forwarded_header`, `ipv6_prefix`, `on_denied`, `degraded_status`,
    `prefix`, `exempt_preflight`.
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: AsyncLimiter,
        rules: Sequence[Rule],
        *,
        exempt: Sequence[PathPattern] = (),
        exempt_when: Callable[[RequestInfo], bool] | None = None,
        deduct_when: Callable[[int], bool] | None = None,
        missing: Missing = "ip",
        x_headers: bool = False,
        user: Callable[[Scope], str | None] = default_user,
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "X-Forwarded-For",
        ipv6_prefix: int = 64,
        on_denied: OnDenied | None = None,
        degraded_status: int = 503,
        prefix: str = "",
        exempt_preflight: bool = True,
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.user = user
        self.gate = Gate(
            rules, exempt=exempt, exempt_when=exempt_when, deduct_when=deduct_when,
            missing=missing, x_headers=x_headers, trusted_proxies=trusted_proxies,
            forwarded_header=forwarded_header, ipv6_prefix=ipv6_prefix, on_denied=on_denied,
            degraded_status=degraded_status, prefix=prefix, exempt_preflight=exempt_preflight,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        info = request_info(scope, self.user)
        p = self.gate.plan(info)
        if p is None:
            await self.app(scope, receive, send)
            return
        self.gate.count(self.limiter, p, info.peer)
        if p.missing is not None:
            await deny(self.gate, scope, receive, send, identity_required(p.missing), None, info)
            return
        if not p.checks:  # every limit skipped (missing="skip")
            await self.app(scope, receive, send)
            return
        d = await adecide(self.limiter, p)
        v = self.gate.verdict(self.limiter, p, d)
        if v.status is not None:
            await deny(self.gate, scope, receive, send, v, d, info)
            return
        state = scope.setdefault("state", {})
        state["rate_limit"] = d
        extra = _raw(v.headers.items())
        charge, token = open_charge()
        settled = False

        async def settle(status: int | None) -> None:
            # Once, on the status sent: before the response goes on (so whoever reads Redis
            # or the counters after the response sees the refund or FORCE), or when the app
            # ends without one (an exception: the 500 the server sends; none: charged).
            nonlocal settled
            if not settled:
                settled = True
                reported = reported_cost(charge, state.get("rate_limit_cost"))
                await asettle(self.limiter, p, d, status, reported, self.gate.deduct_when)

        async def send_with_headers(message: Message) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *extra]
                await settle(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            await settle(500)  # what the server answers for it
            raise
        finally:
            close_charge(token)
            await settle(None)  # no status was sent: the request stays charged
