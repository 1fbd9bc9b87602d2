"""Django: a view decorator and a middleware (needs the `django` extra).

    @rate_limit(limiter, GCRA(5, 1, 60), key=user())
    def report(request): ...

Middleware: add "redis_rl.django.RateLimitMiddleware" to MIDDLEWARE (after
AuthenticationMiddleware, so `request.user` is known) and set in settings:

    REDIS_RL = {"limiter": Limiter.from_url(...), "rules": [Rule(...)], "exempt": ["/health"]}

The view sees its admitted request's decision as `request.rate_limit` (a `Decision`).

Django can also be limited through WSGI: wrap `get_wsgi_application()` with
`redis_rl.wsgi.RateLimitMiddleware`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from ._limits import Limit
from .client import Limiter
from .http import KeyFunc, Plan, RequestInfo, Rule, Verdict, decide, plan, plan_rule, respond
from .wsgi import request_info

__all__ = ["RateLimitMiddleware", "rate_limit"]

F = TypeVar("F", bound=Callable[..., Any])


def _info(request: Any) -> RequestInfo:
    u = getattr(request, "user", None)
    uid = str(u.pk) if u is not None and getattr(u, "is_authenticated", False) else None
    info = request_info(request.META, lambda environ: uid)
    match = getattr(request, "resolver_match", None)
    route = getattr(match, "route", None) if match is not None else None
    return RequestInfo(info.method, request.path_info or info.path, info.headers, info.peer,
                       info.user, route or None, info.content_length)


def _answer(v: Verdict) -> Any:
    from django.http import HttpResponse  # type: ignore[import-untyped]

    resp = HttpResponse(v.body, status=v.status, content_type="application/json")
    for k, val in v.headers.items():
        resp[k] = val
    return resp


def _run(limiter: Limiter, p: Plan, request: Any, view: Callable[[], Any], x_headers: bool) -> Any:
    d = decide(limiter, p)
    v = respond(d, p.names, x_headers=x_headers, prefix=limiter.prefix)
    if v.status is not None:
        return _answer(v)
    # The view sees the admitted request's decision (the innermost limit's, when both the
    # middleware and a decorator apply).
    request.rate_limit = d
    resp = view()
    for k, val in v.headers.items():
        resp[k] = val
    return resp


def rate_limit(
    limiter: Limiter,
    limits: Limit | Mapping[str, tuple[Limit, KeyFunc]],
    *,
    key: KeyFunc | None = None,
    name: str | None = None,
    cost: int | Callable[[RequestInfo], int] = 1,
    x_headers: bool = False,
) -> Callable[[F], F]:
    """rate_limit limits one Django view (function views; for class views decorate
    `as_view()`'s result)."""
    rule = Rule("*", limits, key=key, name=name, cost=cost)

    def deco(view: F) -> F:
        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            p = plan_rule(rule, _info(request))
            if p is None:
                return view(request, *args, **kwargs)
            return _run(limiter, p, request, lambda: view(request, *args, **kwargs), x_headers)

        return cast(F, wrapper)

    return deco


class RateLimitMiddleware:
    """RateLimitMiddleware applies `settings.REDIS_RL["rules"]` to every request."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from django.conf import settings  # type: ignore[import-untyped]

        cfg = settings.REDIS_RL
        self.get_response = get_response
        self.limiter: Limiter = cfg["limiter"]
        self.rules: list[Rule] = list(cfg["rules"])
        self.exempt = list(cfg.get("exempt", ()))
        self.x_headers = bool(cfg.get("x_headers", False))

    def __call__(self, request: Any) -> Any:
        p = plan(self.rules, _info(request), self.exempt)
        if p is None:
            return self.get_response(request)
        return _run(self.limiter, p, request, lambda: self.get_response(request), self.x_headers)
