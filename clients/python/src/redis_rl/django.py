"""Django: a view decorator and a middleware (needs the `django` extra).

    @rate_limit(limiter, "5/minute", key=user())
    def report(request): ...

Middleware: add "redis_rl.django.RateLimitMiddleware" to MIDDLEWARE (after
AuthenticationMiddleware, so `request.user` is known) and set in settings:

    REDIS_RL = {"limiter": Limiter.from_url(...), "rules": [Rule(...)], "exempt": ["/health"]}

`REDIS_RL` takes the parameters of every integration by name (see `redis_rl.http.Gate`):
"exempt", "exempt_when", "deduct_when", "missing", "x_headers", "trusted_proxies",
"forwarded_header", "ipv6_prefix", "on_denied", "degraded_status", "prefix",
"exempt_preflight". `on_denied(denial)` returns the HttpResponse to send (Retry-After and the
RateLimit fields are added where it did not set them); without it the package's JSON answer
is sent.

The view sees its admitted request's decision as `request.rate_limit` (a `Decision`) and
reports the request's true cost with `redis_rl.http.report_cost(n)` or
`request.rate_limit_cost = n`.

Django can also be limited through WSGI: wrap `get_wsgi_application()` with
`redis_rl.wsgi.RateLimitMiddleware`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast

from ._decision import Decision
from ._limits import Algorithm, StringAlgorithm
from .client import Limiter
from .http import (
    Gate,
    KeyFunc,
    LimitSpec,
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
    open_charge,
    reported_cost,
    settle,
)
from .wsgi import request_info

__all__ = ["RateLimitMiddleware", "rate_limit"]

F = TypeVar("F", bound=Callable[..., Any])

_GATE_OPTIONS = (
    "exempt", "exempt_when", "deduct_when", "missing", "x_headers", "trusted_proxies",
    "forwarded_header", "ipv6_prefix", "on_denied", "degraded_status", "prefix",
    "exempt_preflight",
)


def _info(request: Any) -> RequestInfo:
    u = getattr(request, "user", None)
    uid = str(u.pk) if u is not None and getattr(u, "is_authenticated", False) else None
    info = request_info(request.META, lambda environ: uid)
    match = getattr(request, "resolver_match", None)
    if match is None:  # in the middleware, before Django resolved the URL: resolve it here
        from django.urls import Resolver404, resolve  # type: ignore[import-untyped]

        try:
            match = resolve(request.path_info)
        except Resolver404:
            return replace(info, route="", native=request)  # no route: a 404
    route = getattr(match, "route", None)
    return replace(info, route=route or None, native=request)


def _answer(v: Verdict) -> Any:
    from django.http import HttpResponse  # type: ignore[import-untyped]

    resp = HttpResponse(v.body, status=v.status, content_type="application/json")
    for k, val in v.headers.items():
        resp[k] = val
    return resp


def _deny(gate: Gate, v: Verdict, d: Decision | None, request: Any) -> Any:
    if gate.on_denied is not None:
        denial = gate.denial(v, d, _info(request))
        resp = gate.on_denied(denial)
        if inspect.isawaitable(resp):
            raise TypeError("on_denied of the Django integration must not be a coroutine function")
        if isinstance(resp, Verdict):
            resp = _answer(Verdict(resp.status or v.status, resp.headers, resp.body))
        if resp is not None:
            for k, val in denial.limit_headers.items():
                if not resp.has_header(k):
                    resp[k] = val
            return resp
    return _answer(v)


def _run(limiter: Limiter, gate: Gate, p: Plan, request: Any, view: Callable[[], Any]) -> Any:
    gate.count(limiter, p, request.META.get("REMOTE_ADDR"))
    if p.missing is not None:
        return _deny(gate, identity_required(p.missing), None, request)
    if not p.checks:
        return view()
    d = decide(limiter, p)
    v = gate.verdict(limiter, p, d)
    if v.status is not None:
        return _deny(gate, v, d, request)
    # The view sees the admitted request's decision (the innermost limit's, when both the
    # middleware and a decorator apply).
    request.rate_limit = d
    charge, token = open_charge()
    status: int | None = None
    try:
        resp = view()
        status = int(resp.status_code)
    except Exception:
        status = 500  # what Django answers for it
        raise
    finally:
        close_charge(token)
        reported = reported_cost(charge, getattr(request, "rate_limit_cost", None))
        settle(limiter, p, d, status, reported, gate.deduct_when)
    for k, val in v.headers.items():
        resp[k] = val
    return resp


def rate_limit(
    limiter: Limiter,
    limits: LimitSpec | Mapping[str, tuple[LimitSpec, KeyFunc]],
    *,
    key: KeyFunc | None = None,
    name: str | None = None,
    cost: int | Callable[[RequestInfo], int] = 1,
    missing: Missing = "ip",
    hash_tag: str | None = None,
    algorithm: StringAlgorithm = Algorithm.SLIDING,
    exempt: Iterable[PathPattern] = (),
    exempt_when: Callable[[RequestInfo], bool] | None = None,
    deduct_when: Callable[[int], bool] | None = None,
    x_headers: bool = False,
    trusted_proxies: Iterable[str] = (),
    forwarded_header: str = "X-Forwarded-For",
    ipv6_prefix: int = 64,
    on_denied: OnDenied | None = None,
    degraded_status: int = 503,
    prefix: str = "",
    exempt_preflight: bool = True,
) -> Callable[[F], F]:
    """rate_limit limits one Django view (function views; for class views decorate
    `as_view()`'s result); the parameters of `redis_rl.http.Rule` for the limit, of
    `redis_rl.http.Gate` for the rest."""
    rule = Rule("*", limits, key=key, name=name, cost=cost, hash_tag=hash_tag, algorithm=algorithm)
    gate = Gate(
        [rule], exempt=list(exempt), exempt_when=exempt_when, deduct_when=deduct_when,
        missing=missing, x_headers=x_headers, trusted_proxies=trusted_proxies,
        forwarded_header=forwarded_header, ipv6_prefix=ipv6_prefix, on_denied=on_denied,
        degraded_status=degraded_status, prefix=prefix, exempt_preflight=exempt_preflight,
    )

    def deco(view: F) -> F:
        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            p = gate.plan(_info(request), rule)
            if p is None:
                return view(request, *args, **kwargs)
            return _run(limiter, gate, p, request, lambda: view(request, *args, **kwargs))

        return cast(F, wrapper)

    return deco


class RateLimitMiddleware:
    """RateLimitMiddleware applies `settings.REDIS_RL["rules"]` to every request."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from django.conf import settings  # type: ignore[import-untyped]

        cfg = settings.REDIS_RL
        self.get_response = get_response
        self.limiter: Limiter = cfg["limiter"]
        options = {k: cfg[k] for k in _GATE_OPTIONS if k in cfg}
        unknown = set(cfg) - {"limiter", "rules", *_GATE_OPTIONS}
        if unknown:
            raise ValueError(f"REDIS_RL has unknown settings: {sorted(unknown)}")
        self.gate = Gate(list(cfg.get("rules", ())), **options)

    @property
    def rules(self) -> list[Rule]:
        return self.gate.rules

    def __call__(self, request: Any) -> Any:
        p = self.gate.plan(_info(request))
        if p is None:
            return self.get_response(request)
        return _run(self.limiter, self.gate, p, request, lambda: self.get_response(request))
