"""ASGI middleware (FastAPI, Starlette, any ASGI app), with an AsyncLimiter.

    app.add_middleware(RateLimitMiddleware, limiter=limiter, rules=[
        Rule("/api/", GCRA(10, 5, 1), key=header("X-API-Key", "anonymous")),
    ], exempt=["/health"])

Admitted requests pass with the RateLimit fields added to the response; denied ones get 429
with Retry-After, the fields and a JSON body; a request that can never pass gets 413; a
"closed" failure-policy denial gets 503 with Retry-After. No dependency beyond the ASGI spec.

The app sees the decision of an admitted request in `scope["state"]["rate_limit"]`, which
Starlette and FastAPI read as `request.state.rate_limit` (a `Decision`; absent when no rule
or key applied).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from .aio import AsyncLimiter
from .http import (
    PathPattern,
    RequestInfo,
    Rule,
    Verdict,
    adecide,
    lower_headers,
    plan,
    respond,
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


def request_info(scope: Scope, user: Callable[[Scope], str | None] = default_user) -> RequestInfo:
    """request_info builds a RequestInfo from an ASGI HTTP scope."""
    headers = lower_headers(scope.get("headers") or [])
    client = scope.get("client")
    length = headers.get("content-length")
    return RequestInfo(
        method=str(scope.get("method", "GET")),
        path=str(scope.get("path", "/")),
        headers=headers,
        peer=str(client[0]) if client else None,
        user=user(scope),
        content_length=int(length) if length and length.isdigit() else None,
    )


async def send_verdict(send: Send, v: Verdict) -> None:
    """send_verdict answers a denied request."""
    assert v.status is not None
    headers = [(k.lower().encode("latin-1"), val.encode("latin-1")) for k, val in v.headers.items()]
    headers.append((b"content-length", str(len(v.body)).encode()))
    await send({"type": "http.response.start", "status": v.status, "headers": headers})
    await send({"type": "http.response.body", "body": v.body})


class RateLimitMiddleware:
    """RateLimitMiddleware limits an ASGI app's HTTP requests by `rules` (first match wins).

    `exempt`: path patterns never limited. `user`: how to read the authenticated user from
    the scope (default: Starlette's scope["user"]). `x_headers`: add X-RateLimit-*.
    """

    def __init__(
        self,
        app: ASGIApp,
        limiter: AsyncLimiter,
        rules: Sequence[Rule],
        *,
        exempt: Sequence[PathPattern] = (),
        user: Callable[[Scope], str | None] = default_user,
        x_headers: bool = False,
        degraded_status: int = 503,
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.rules = list(rules)
        self.exempt = list(exempt)
        self.user = user
        self.x_headers = x_headers
        self.degraded_status = degraded_status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        p = plan(self.rules, request_info(scope, self.user), self.exempt)
        if p is None:
            await self.app(scope, receive, send)
            return
        d = await adecide(self.limiter, p)
        v = respond(
            d, p.names, x_headers=self.x_headers, degraded_status=self.degraded_status,
            prefix=self.limiter.prefix,
        )
        if v.status is not None:
            await send_verdict(send, v)
            return
        scope.setdefault("state", {})["rate_limit"] = d
        extra = [(k.lower().encode("latin-1"), val.encode("latin-1")) for k, val in v.headers.items()]

        async def send_with_headers(message: Message) -> None:
            if message.get("type") == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)
