"""WSGI middleware (Flask, Django, any WSGI app), with a sync Limiter.

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter, rules=[...])      # Flask
    application = RateLimitMiddleware(get_wsgi_application(), limiter, rules)  # Django

Same answers as the ASGI middleware: RateLimit fields on admitted responses, 429 with
Retry-After and a JSON body (or what `on_denied` returns), 413 for a request that can never
pass, 503 for a "closed" failure-policy denial, 401 for a missing identity under
`missing="deny"`.

The app sees the decision of an admitted request in `environ["redis_rl.decision"]`
(`DECISION_ENVIRON_KEY`; Flask: `request.environ[...]`), absent when no rule or key applied.
A handler reports the request's true cost with `redis_rl.http.report_cost(n)` or
`environ["redis_rl.cost"] = n` (`COST_ENVIRON_KEY`). The charge is settled (`deduct_when`,
the reported cost) on the status the app starts its response with, before the response goes
to the server.

For Flask, `redis_rl.flask.RateLimits` applies the same rules inside the app, where a denial
is a werkzeug HTTPException that `@app.errorhandler(429)` answers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .client import Limiter
from .http import (
    Gate,
    Missing,
    OnDenied,
    PathPattern,
    Plan,
    RequestInfo,
    Rule,
    Verdict,
    close_charge,
    decide,
    identity_required,
    merge_headers,
    normalise_path,
    open_charge,
    reported_cost,
    settle,
    status_text,
)

__all__ = ["COST_ENVIRON_KEY", "DECISION_ENVIRON_KEY", "RateLimitMiddleware", "request_info"]

DECISION_ENVIRON_KEY = "redis_rl.decision"
"""The WSGI environ key under which an admitted request's `Decision` reaches the app."""

COST_ENVIRON_KEY = "redis_rl.cost"
"""The WSGI environ key where the app may report the request's true cost (an int ≥ 0)."""

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
        method=str(environ.get("REQUEST_METHOD", "GET")).upper(),
        path=normalise_path(str(environ.get("PATH_INFO", "/")) or "/"),
        headers=headers,
        peer=environ.get("REMOTE_ADDR"),
        user=user(environ),
        content_length=int(length) if length.isdigit() else None,
        native=environ,
    )


def verdict_response(v: Verdict, start_response: StartResponse) -> list[bytes]:
    assert v.status is not None
    headers = [*v.headers.items(), ("Content-Length", str(len(v.body)))]
    start_response(f"{v.status} {status_text(v.status)}", headers)
    return [v.body]


def deny(
    gate: Gate, environ: Environ, start_response: StartResponse, v: Verdict, d: Any,
    info: RequestInfo,
) -> Iterable[bytes]:
    """deny answers a denial: `on_denied`'s response (a WSGI app, such as a werkzeug or Flask
    Response, or a Verdict), with Retry-After and the RateLimit fields added where it did not
    set them; else the package's JSON answer."""
    if gate.on_denied is not None:
        denial = gate.denial(v, d, info)
        resp = gate.on_denied(denial)
        if inspect.isawaitable(resp):
            raise TypeError("on_denied of a WSGI middleware must not be a coroutine function")
        if isinstance(resp, Verdict):
            merged = dict(merge_headers(resp.headers.items(), denial.limit_headers))
            return verdict_response(Verdict(resp.status or v.status, merged, resp.body), start_response)
        if resp is not None:
            ours = denial.limit_headers

            def start_merged(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                return start_response(status, merge_headers(headers, ours), exc_info)

            result: Iterable[bytes] = resp(environ, start_merged)
            return result
    return verdict_response(v, start_response)


class RateLimitMiddleware:
    """RateLimitMiddleware limits a WSGI app's requests by `rules` (first match wins).

    `user`: how to read the authenticated user from the environ (default REMOTE_USER). The
    other parameters are those of every integration (see `redis_rl.http.Gate`): `exempt`,
    `exempt_when`, `deduct_when`, `missing`, `x_headers`, `trusted_proxies`,
    `forwarded_header`, `ipv6_prefix`, `on_denied`, `degraded_status`, `prefix`,
    `exempt_preflight`.
    """

    def __init__(
        self,
        app: WSGIApp,
        limiter: Limiter,
        rules: Sequence[Rule],
        *,
        exempt: Sequence[PathPattern] = (),
        exempt_when: Callable[[RequestInfo], bool] | None = None,
        deduct_when: Callable[[int], bool] | None = None,
        missing: Missing = "ip",
        x_headers: bool = False,
        user: Callable[[Environ], str | None] = default_user,
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

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        info = request_info(environ, self.user)
        p = self.gate.plan(info)
        if p is None:
            return self.app(environ, start_response)
        self.gate.count(self.limiter, p, info.peer)
        if p.missing is not None:
            return deny(self.gate, environ, start_response, identity_required(p.missing), None, info)
        if not p.checks:
            return self.app(environ, start_response)
        d = decide(self.limiter, p)
        v = self.gate.verdict(self.limiter, p, d)
        if v.status is not None:
            return deny(self.gate, environ, start_response, v, d, info)
        environ[DECISION_ENVIRON_KEY] = d
        return self._run(environ, start_response, p, d, list(v.headers.items()))

    def _run(
        self, environ: Environ, start_response: StartResponse, p: Plan, d: Any,
        extra: list[tuple[str, str]],
    ) -> Iterable[bytes]:
        charge, token = open_charge()
        settled: list[bool] = []

        def settle_once(status: int | None) -> None:
            # Once, on the status the app starts its response with, before the response goes
            # to the server (so whoever reads Redis or the counters after it sees the refund
            # or FORCE); an exception before that is the 500 the server sends.
            if not settled:
                settled.append(True)
                reported = reported_cost(charge, environ.get(COST_ENVIRON_KEY))
                settle(self.limiter, p, d, status, reported, self.gate.deduct_when)

        def start_with_headers(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            settle_once(int(s.split(" ", 1)[0]))
            return start_response(s, [*headers, *extra], exc_info)

        try:
            return self.app(environ, start_with_headers)
        except Exception:
            settle_once(500)
            raise
        finally:
            close_charge(token)
