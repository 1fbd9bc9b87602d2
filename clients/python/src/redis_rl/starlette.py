"""Per-endpoint limits for Starlette and FastAPI (needs the `starlette` extra).

FastAPI, as a dependency (the RateLimit fields are set on the endpoint's response; a denial
raises `RateLimitDenied`, an HTTPException, so the app's exception handlers answer it):

    api_limit = RateLimit(limiter, "10/minute", key=header("X-API-Key"))

    @app.get("/items", dependencies=[Depends(api_limit)])
    async def items(): ...

Starlette (or FastAPI endpoints that take `request`), as a decorator:

    @rate_limit(limiter, Window(5, 60, "LOG"), key=client_ip())
    async def login(request): ...

The dependency returns the admitted request's `Decision` (FastAPI: `d = Depends(api_limit)`);
the decorator puts it in `request.state.rate_limit`.

Denials are exceptions of the framework: `RateLimitExceeded` (429), `CostTooLarge` (413),
`LimiterClosed` (503, failure policy "closed") and `IdentityRequired` (401, `missing="deny"`),
all `RateLimitDenied`, an `HTTPException` carrying `.denial` (the decision, the ready
headers, the package's JSON body). Register a handler for a status code
(`@app.exception_handler(429)`) or a class and it is called; `exception_handler` (below) is
one that answers the package's JSON body, or `on_denied`'s response. Without a handler of
yours, FastAPI answers its own way (`{"detail": {...}}`), and the decorator answers the
package's JSON itself.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ._decision import Decision
from .aio import AsyncLimiter
from .asgi import Scope, default_user, request_info, route_template
from .http import (
    Denial,
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
    adecide,
    asettle,
    close_charge,
    identity_required,
    merge_headers,
    open_charge,
    reported_cost,
)
from ._limits import Algorithm, StringAlgorithm

__all__ = [
    "CostTooLarge",
    "IdentityRequired",
    "LimiterClosed",
    "RateLimit",
    "RateLimitDenied",
    "RateLimitExceeded",
    "exception_handler",
    "rate_limit",
]

E = TypeVar("E", bound=Callable[..., Awaitable[Response]])


class RateLimitDenied(HTTPException):
    """RateLimitDenied is a request the limiter does not let through, as Starlette's
    HTTPException: `status_code`, `headers` (Retry-After, the RateLimit fields), `detail`
    (the package's JSON body, as a dict), `denial` (a `redis_rl.http.Denial`, with the
    Decision), and `response` (what `on_denied` returned, if anything)."""

    def __init__(self, denial: Denial, response: Any = None) -> None:
        super().__init__(denial.status, detail=json.loads(denial.body), headers=denial.limit_headers)
        self.denial = denial
        self.response = response

    @property
    def decision(self) -> Decision | None:
        return self.denial.decision


class RateLimitExceeded(RateLimitDenied):
    """RateLimitExceeded: 429, the limit is reached (retry after `Retry-After`)."""


class CostTooLarge(RateLimitDenied):
    """CostTooLarge: 413, the request asks for more than the limit allows and can never pass."""


class LimiterClosed(RateLimitDenied):
    """LimiterClosed: 503, Redis is unavailable and the failure policy is "closed"."""


class IdentityRequired(RateLimitDenied):
    """IdentityRequired: 401, the request lacks an identity a rule requires (missing="deny")."""


_CLASSES: dict[int, type[RateLimitDenied]] = {
    429: RateLimitExceeded, 413: CostTooLarge, 401: IdentityRequired,
}


def denied_error(denial: Denial, response: Any = None) -> RateLimitDenied:
    """denied_error is the exception of a denial (by its status)."""
    return _CLASSES.get(denial.status, LimiterClosed)(denial, response)


async def exception_handler(request: Request, exc: Exception) -> Response:
    """exception_handler answers a RateLimitDenied with `on_denied`'s response (with the
    RateLimit fields it did not set) or the package's JSON body: register it with
    `app.add_exception_handler(RateLimitDenied, exception_handler)` for FastAPI's
    dependencies to answer like every other integration."""
    assert isinstance(exc, RateLimitDenied)
    return _response(exc.denial, exc.response)


def _response(denial: Denial, custom: Any) -> Response:
    if isinstance(custom, Response):
        for k, v in denial.limit_headers.items():
            if k.lower() not in custom.headers:
                custom.headers[k] = v
        return custom
    if isinstance(custom, Verdict):
        headers = dict(merge_headers(custom.headers.items(), denial.limit_headers))
        return Response(custom.body, custom.status or denial.status, headers=headers)
    return Response(denial.body, denial.status, headers=denial.limit_headers, media_type="application/json")


def _has_handler(request: Request, exc: RateLimitDenied) -> bool:
    """_has_handler: the app registered a handler of its own for this denial (its status
    code, or a class of it other than HTTPException and Exception)."""
    handlers = getattr(getattr(request, "app", None), "exception_handlers", None) or {}
    if exc.status_code in handlers:
        return True
    return any(
        cls in handlers for cls in type(exc).__mro__ if cls not in (HTTPException, Exception, BaseException, object)
    )


def _status_of(exc: BaseException) -> int:
    return exc.status_code if isinstance(exc, HTTPException) else 500


class RateLimit:
    """RateLimit is one endpoint's limit (or limits, checked together), for FastAPI's
    `Depends` or as a Starlette endpoint decorator (`RateLimit(...).decorate`).

    `limits`, `key`, `name`, `cost`, `missing`, `hash_tag`, `algorithm` are those of
    `redis_rl.http.Rule`; `user` reads the user from the scope; the rest are those of every
    integration (see `redis_rl.http.Gate`).

    As a FastAPI dependency, `deduct_when` sees the status FastAPI sends for the endpoint's
    outcome: an HTTPException's, 500 for another exception, else the status the endpoint set
    on its `response: Response` parameter or the route's `status_code` (200); an endpoint
    that returns a Response object of its own with another status is seen with the route's.
    The ASGI `RateLimitMiddleware` sees every status exactly.
    """

    def __init__(
        self,
        limiter: AsyncLimiter,
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
        user: Callable[[Scope], str | None] = default_user,
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "X-Forwarded-For",
        ipv6_prefix: int = 64,
        on_denied: OnDenied | None = None,
        degraded_status: int = 503,
        prefix: str = "",
        exempt_preflight: bool = True,
    ) -> None:
        self.limiter = limiter
        self.rule = Rule("*", limits, key=key, name=name, cost=cost, hash_tag=hash_tag, algorithm=algorithm)
        self.user = user
        self.gate = Gate(
            [self.rule], exempt=list(exempt), exempt_when=exempt_when, deduct_when=deduct_when,
            missing=missing, x_headers=x_headers, trusted_proxies=trusted_proxies,
            forwarded_header=forwarded_header, ipv6_prefix=ipv6_prefix, on_denied=on_denied,
            degraded_status=degraded_status, prefix=prefix, exempt_preflight=exempt_preflight,
        )

    def info(self, request: Request) -> RequestInfo:
        info = request_info(request.scope, self.user)
        template = route_template(request.scope)
        from dataclasses import replace

        return replace(info, route=template if template is not None else info.route, native=request)

    async def check(self, request: Request) -> tuple[Plan | None, Decision | None, Verdict]:
        """check decides for a request: (plan, decision, answer); plan None when exempt or
        no limit applies, the answer's status None when admitted."""
        info = self.info(request)
        p = self.gate.plan(info, self.rule)
        if p is None:
            return None, None, Verdict(None, {})
        self.gate.count(self.limiter, p, info.peer)
        if p.missing is not None:
            return p, None, identity_required(p.missing)
        if not p.checks:
            return None, None, Verdict(None, {})
        d = await adecide(self.limiter, p)
        return p, d, self.gate.verdict(self.limiter, p, d)

    async def verdict(self, request: Request) -> tuple[Decision | None, Verdict]:
        """verdict decides for a request: (decision or None when no key applies, answer)."""
        _, d, v = await self.check(request)
        return d, v

    async def _denial(self, request: Request, d: Decision | None, v: Verdict) -> RateLimitDenied:
        denial = self.gate.denial(v, d, self.info(request))
        custom = self.gate.on_denied(denial) if self.gate.on_denied is not None else None
        if inspect.isawaitable(custom):
            custom = await custom
        return denied_error(denial, custom)

    async def __call__(self, request: Request, response: Response) -> AsyncIterator[Decision | None]:
        """FastAPI dependency: sets the fields on the response, raises RateLimitDenied on a
        denial; after the response, settles the charge (deduct_when, reported cost)."""
        p, d, v = await self.check(request)
        if v.status is not None:
            raise await self._denial(request, d, v)
        for k, val in v.headers.items():
            response.headers[k] = val
        charge, token = open_charge()
        status: int | None = None
        try:
            yield d
        except BaseException as exc:
            status = _status_of(exc) if isinstance(exc, Exception) else None
            raise
        else:
            route = request.scope.get("route")
            status = getattr(response, "status_code", None) or getattr(route, "status_code", None) or 200
        finally:
            close_charge(token)
            if p is not None and d is not None:
                reported = reported_cost(charge, getattr(request.state, "rate_limit_cost", None))
                await asettle(self.limiter, p, d, status, reported, self.gate.deduct_when)

    def decorate(self, endpoint: E) -> E:
        """decorate wraps a Starlette endpoint `async def endpoint(request) -> Response`."""

        @functools.wraps(endpoint)
        async def wrapper(request: Request, *args: Any, **kwargs: Any) -> Response:
            p, d, v = await self.check(request)
            if v.status is not None:
                exc = await self._denial(request, d, v)
                if _has_handler(request, exc):
                    raise exc
                return _response(exc.denial, exc.response)
            if d is not None:
                request.state.rate_limit = d
            charge, token = open_charge()
            status: int | None = None
            try:
                resp = await endpoint(request, *args, **kwargs)
                status = resp.status_code
            except Exception as exc:
                status = _status_of(exc)
                raise
            finally:
                close_charge(token)
                if p is not None and d is not None:
                    reported = reported_cost(charge, getattr(request.state, "rate_limit_cost", None))
                    await asettle(self.limiter, p, d, status, reported, self.gate.deduct_when)
            for k, val in v.headers.items():
                resp.headers[k] = val
            return resp

        return wrapper  # type: ignore[return-value]


def rate_limit(
    limiter: AsyncLimiter,
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
    user: Callable[[Scope], str | None] = default_user,
    trusted_proxies: Iterable[str] = (),
    forwarded_header: str = "X-Forwarded-For",
    ipv6_prefix: int = 64,
    on_denied: OnDenied | None = None,
    degraded_status: int = 503,
    prefix: str = "",
    exempt_preflight: bool = True,
) -> Callable[[E], E]:
    """rate_limit is the decorator form of RateLimit for Starlette endpoints (the same
    parameters)."""
    return RateLimit(
        limiter, limits, key=key, name=name, cost=cost, missing=missing, hash_tag=hash_tag,
        algorithm=algorithm, exempt=exempt, exempt_when=exempt_when, deduct_when=deduct_when,
        x_headers=x_headers, user=user, trusted_proxies=trusted_proxies,
        forwarded_header=forwarded_header, ipv6_prefix=ipv6_prefix, on_denied=on_denied,
        degraded_status=degraded_status, prefix=prefix, exempt_preflight=exempt_preflight,
    ).decorate
