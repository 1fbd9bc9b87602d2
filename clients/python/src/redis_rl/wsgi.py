"""WSGI middleware (Flask, Django, any WSGI app), with a sync Limiter.

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, rules=[...])      # Flask
    application = RateLimitMiddleware(get_wsgi_application(), limiter, rules)  # Django

Same answers as the ASGI middleware: RateLimit fields on admitted responses, 429 with
Retry-After and a JSON body, 413 for a request that can never pass, 503 for a "closed"
failure-policy denial.

The app sees the decision of an admitted request in `environ["redis_rl.decision"]`
(`DECISION_ENVIRON_KEY`; Flask: `request.environ[...]`), absent when no rule or key applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .client import Limiter
from .http import (
    PathPattern,
    RequestInfo,
    Rule,
    Verdict,
    decide,
    plan,
    respond,
    status_text,
)

__all__ = ["DECISION_ENVIRON_KEY", "RateLimitMiddleware", "request_info"]

DECISION_ENVIRON_KEY = "redis_rl.decision"
"""The WSGI environ key under which an admitted request's `Decision` reaches the app."""

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def default_user(environ: Environ) -> str | None:
    """default_user reads REMOTE_USER (set by the server or an auth middleware)."""
    u = environ.get("REMOTE_USER")
    return str(u) if u else None


def request_info(environ: Environ, user: Callable[[Environ], str | None] = default_user) -> RequestInfo:
    """request_info builds a RequestInfo from a WSGI environ."""
    headers: dict[str, str] = {}
    for k, v in environ.items():
        if k.startswith("HTTP_"):
            headers[k[5:].replace("_", "-").lower()] = str(v)
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = str(environ["CONTENT_TYPE"])
    length = str(environ.get("CONTENT_LENGTH") or "")
    if length:
        headers["content-length"] = length
    return RequestInfo(
        method=str(environ.get("REQUEST_METHOD", "GET")),
        path=str(environ.get("PATH_INFO", "/")) or "/",
        headers=headers,
        peer=environ.get("REMOTE_ADDR"),
        user=user(environ),
        content_length=int(length) if length.isdigit() else None,
    )


def verdict_response(v: Verdict, start_response: StartResponse) -> list[bytes]:
    assert v.status is not None
    headers = [*v.headers.items(), ("Content-Length", str(len(v.body)))]
    start_response(f"{v.status} {status_text(v.status)}", headers)
    return [v.body]


class RateLimitMiddleware:
    """RateLimitMiddleware limits a WSGI app's requests by `rules` (first match wins).

    `exempt`: path patterns never limited. `user`: how to read the authenticated user from
    the environ (default REMOTE_USER). `x_headers`: add X-RateLimit-*.
    """

    def __init__(
        self,
        app: WSGIApp,
        limiter: Limiter,
        rules: Sequence[Rule],
        *,
        exempt: Sequence[PathPattern] = (),
        user: Callable[[Environ], str | None] = default_user,
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

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        p = plan(self.rules, request_info(environ, self.user), self.exempt)
        if p is None:
            return self.app(environ, start_response)
        d = decide(self.limiter, p)
        v = respond(
            d, p.names, x_headers=self.x_headers, degraded_status=self.degraded_status,
            prefix=self.limiter.prefix,
        )
        if v.status is not None:
            return verdict_response(v, start_response)
        environ[DECISION_ENVIRON_KEY] = d
        extra = list(v.headers.items())

        def start_with_headers(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, *extra], exc_info)

        return self.app(environ, start_with_headers)
