"""Per-endpoint limits for Starlette and FastAPI (needs the `starlette` extra).

FastAPI, as a dependency (headers are set on the endpoint's response; a denial raises
HTTPException with status 429/413/503, the headers, and the JSON body as `detail`):

    api_limit = RateLimit(limiter, GCRA(10, 5, 1), key=header("X-API-Key", "anonymous"))

    @app.get("/items", dependencies=[Depends(api_limit)])
    async def items(): ...

Starlette (or FastAPI endpoints that take `request`), as a decorator:

    @rate_limit(limiter, Window(5, 60, "LOG"), key=client_ip())
    async def login(request): ...

The dependency returns the admitted request's `Decision` (FastAPI: `d = Depends(api_limit)`);
the decorator puts it in `request.state.rate_limit`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ._decision import Decision
from ._limits import Limit
from .aio import AsyncLimiter
from .asgi import Scope, default_user, request_info
from .http import KeyFunc, RequestInfo, Rule, Verdict, adecide, plan_rule, respond

__all__ = ["RateLimit", "rate_limit"]

E = TypeVar("E", bound=Callable[..., Awaitable[Response]])


class RateLimit:
    """RateLimit is one endpoint's limit (or limits, checked together), for FastAPI's
    `Depends` or as a Starlette endpoint decorator (`RateLimit(...).decorate`)."""

    def __init__(
        self,
        limiter: AsyncLimiter,
        limits: Limit | Mapping[str, tuple[Limit, KeyFunc]],
        *,
        key: KeyFunc | None = None,
        name: str | None = None,
        cost: int | Callable[[RequestInfo], int] = 1,
        user: Callable[[Scope], str | None] = default_user,
        x_headers: bool = False,
    ) -> None:
        self.limiter = limiter
        self.rule = Rule("*", limits, key=key, name=name, cost=cost)
        self.user = user
        self.x_headers = x_headers

    async def verdict(self, request: Request) -> tuple[Decision | None, Verdict]:
        """verdict decides for a request: (decision or None when no key applies, answer)."""
        info = request_info(request.scope, self.user)
        route = request.scope.get("route")
        if route is not None and getattr(route, "path", None):
            info = RequestInfo(info.method, info.path, info.headers, info.peer, info.user,
                               str(route.path), info.content_length)
        p = plan_rule(self.rule, info)
        if p is None:
            return None, Verdict(None, {})
        d = await adecide(self.limiter, p)
        return d, respond(d, p.names, x_headers=self.x_headers, prefix=self.limiter.prefix)

    async def __call__(self, request: Request, response: Response) -> Decision | None:
        """FastAPI dependency: sets the fields on the response, raises on a denial."""
        d, v = await self.verdict(request)
        if v.status is not None:
            raise HTTPException(v.status, detail=json.loads(v.body), headers=v.headers)
        for k, val in v.headers.items():
            response.headers[k] = val
        return d

    def decorate(self, endpoint: E) -> E:
        """decorate wraps a Starlette endpoint `async def endpoint(request) -> Response`."""

        @functools.wraps(endpoint)
        async def wrapper(request: Request, *args: Any, **kwargs: Any) -> Response:
            d, v = await self.verdict(request)
            if v.status is not None:
                return Response(v.body, v.status, headers=v.headers, media_type="application/json")
            if d is not None:
                request.state.rate_limit = d
            resp = await endpoint(request, *args, **kwargs)
            for k, val in v.headers.items():
                resp.headers[k] = val
            return resp

        return wrapper  # type: ignore[return-value]


def rate_limit(
    limiter: AsyncLimiter,
    limits: Limit | Mapping[str, tuple[Limit, KeyFunc]],
    *,
    key: KeyFunc | None = None,
    name: str | None = None,
    cost: int | Callable[[RequestInfo], int] = 1,
) -> Callable[[E], E]:
    """rate_limit is the decorator form of RateLimit for Starlette endpoints."""
    return RateLimit(limiter, limits, key=key, name=name, cost=cost).decorate
