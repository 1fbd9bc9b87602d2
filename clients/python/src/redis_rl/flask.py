"""Per-view limits for Flask (needs the `flask` extra). App-wide limits: wrap
`app.wsgi_app` with `redis_rl.wsgi.RateLimitMiddleware`.

    @app.get("/reports")
    @rate_limit(limiter, GCRA(5, 1, 60), key=user())
    def reports(): ...

The authenticated user is `flask.g.user_id` if the app sets it, else REMOTE_USER. The view
sees its admitted request's decision as `flask.g.rate_limit`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import flask

from ._limits import Limit
from .client import Limiter
from .http import KeyFunc, RequestInfo, Rule, decide, plan_rule, respond
from .wsgi import request_info

__all__ = ["rate_limit"]

F = TypeVar("F", bound=Callable[..., Any])


def flask_user(environ: dict[str, Any]) -> str | None:
    """flask_user reads `flask.g.user_id`, else REMOTE_USER."""
    uid = flask.g.get("user_id")
    if uid is not None:
        return str(uid)
    remote = environ.get("REMOTE_USER")
    return str(remote) if remote else None


def rate_limit(
    limiter: Limiter,
    limits: Limit | Mapping[str, tuple[Limit, KeyFunc]],
    *,
    key: KeyFunc | None = None,
    name: str | None = None,
    cost: int | Callable[[RequestInfo], int] = 1,
    user: Callable[[dict[str, Any]], str | None] = flask_user,
    x_headers: bool = False,
) -> Callable[[F], F]:
    """rate_limit limits one Flask view: 429/413/503 with a JSON body when denied, the
    RateLimit fields on every admitted response."""
    rule = Rule("*", limits, key=key, name=name, cost=cost)

    def deco(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            req = flask.request
            info = request_info(req.environ, user)
            if req.url_rule is not None:
                info = RequestInfo(info.method, info.path, info.headers, info.peer, info.user,
                                   req.url_rule.rule, info.content_length)
            p = plan_rule(rule, info)
            if p is not None:
                d = decide(limiter, p)
                v = respond(d, p.names, x_headers=x_headers, prefix=limiter.prefix)
                if v.status is not None:
                    return flask.Response(v.body, v.status, headers=v.headers)
                flask.g.rate_limit = d
                headers = v.headers

                @flask.after_this_request
                def add_headers(resp: flask.Response) -> flask.Response:
                    resp.headers.update(headers)
                    return resp

            return view(*args, **kwargs)

        return cast(F, wrapper)

    return deco
