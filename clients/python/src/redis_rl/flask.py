"""Flask: per-view limits and app-wide rules (needs the `flask` extra).

    @app.get("/reports")
    @rate_limit(limiter, "5/minute", key=user())
    def reports(): ...

    RateLimits(app, limiter, rules=[Rule("/api/", "100/minute", key=header("X-API-Key"))])

A denial raises a werkzeug HTTPException the Flask way, so `@app.errorhandler(429)` answers it:
`RateLimitExceeded` (a `TooManyRequests`, 429), `CostTooLarge` (a `RequestEntityTooLarge`,
413), `LimiterClosed` (a `ServiceUnavailable`, 503, failure policy "closed"),
`IdentityRequired` (an `Unauthorized`, 401, `missing="deny"`); each is a `RateLimitDenied`
carrying `.denial` (the Decision, the ready headers, the package's JSON body). The app's
handler's response keeps Retry-After and the RateLimit fields unless it sets them; without a
handler the package's JSON answer is sent. `on_denied(denial)` answers instead of raising.

The authenticated user is `flask.g.user_id` if the app sets it, else REMOTE_USER. A view sees
its admitted request's decision as `flask.g.rate_limit`, and reports the request's true cost
with `redis_rl.http.report_cost(n)` or `flask.g.rate_limit_cost = n`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast

import flask
from werkzeug.exceptions import (
    HTTPException,
    RequestEntityTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
)
from werkzeug.sansio.response import Response as SansIOResponse
from werkzeug.wrappers import Response as WerkzeugResponse

from ._decision import Decision
from ._limits import Algorithm, StringAlgorithm
from .client import Limiter
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
    close_charge,
    decide,
    identity_required,
    open_charge,
    reported_cost,
    settle,
)
from .wsgi import request_info

__all__ = [
    "CostTooLarge",
    "IdentityRequired",
    "LimiterClosed",
    "RateLimitDenied",
    "RateLimitExceeded",
    "RateLimits",
    "rate_limit",
]

F = TypeVar("F", bound=Callable[..., Any])


class RateLimitDenied(HTTPException):
    """RateLimitDenied is a request the limiter does not let through, as a werkzeug
    HTTPException: `code`, `denial` (a `redis_rl.http.Denial`: the Decision, the ready
    headers, the package's JSON body) and `decision`. Its default response is the package's
    JSON answer with Retry-After and the RateLimit fields."""

    def __init__(self, denial: Denial) -> None:
        super().__init__(description=denial.error)
        self.denial = denial

    @property
    def decision(self) -> Decision | None:
        return self.denial.decision

    def get_response(self, environ: Any = None, scope: Any = None) -> WerkzeugResponse:
        return WerkzeugResponse(self.denial.body, self.denial.status, headers=self.denial.headers)

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return list(self.denial.headers.items())


class RateLimitExceeded(RateLimitDenied, TooManyRequests):
    """RateLimitExceeded: 429, the limit is reached (`@app.errorhandler(429)` answers it)."""


class CostTooLarge(RateLimitDenied, RequestEntityTooLarge):
    """CostTooLarge: 413, the request asks for more than the limit allows and can never pass."""


class LimiterClosed(RateLimitDenied, ServiceUnavailable):
    """LimiterClosed: 503, Redis is unavailable and the failure policy is "closed"."""


class IdentityRequired(RateLimitDenied, Unauthorized):
    """IdentityRequired: 401, the request lacks an identity a rule requires (missing="deny")."""

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return list(self.denial.headers.items())


_CLASSES: dict[int, type[RateLimitDenied]] = {
    429: RateLimitExceeded, 413: CostTooLarge, 401: IdentityRequired,
}


def flask_user(environ: dict[str, Any]) -> str | None:
    """flask_user reads `flask.g.user_id`, else REMOTE_USER."""
    uid = flask.g.get("user_id")
    if uid is not None:
        return str(uid)
    remote = environ.get("REMOTE_USER")
    return str(remote) if remote else None


class _Flask:
    """_Flask is the request → decision → answer → settlement steps inside a Flask request."""

    def __init__(self, limiter: Limiter, gate: Gate, user: Callable[[dict[str, Any]], str | None]) -> None:
        self.limiter = limiter
        self.gate = gate
        self.user = user

    def info(self) -> RequestInfo:
        req = flask.request
        info = request_info(req.environ, self.user)
        template = req.url_rule.rule if req.url_rule is not None else ""
        return replace(info, route=template, native=req)

    def run(self, rule: Rule | None) -> Any:
        """run limits the current request (by `rule`, or the gate's rules): None to go on,
        or a response to return; raises RateLimitDenied for the app's error handlers."""
        info = self.info()
        p = self.gate.plan(info, rule)
        if p is None:
            return None
        self.gate.count(self.limiter, p, info.peer)
        if p.missing is not None:
            return self.deny(identity_required(p.missing), None, info)
        if not p.checks:
            return None
        d = decide(self.limiter, p)
        v = self.gate.verdict(self.limiter, p, d)
        if v.status is not None:
            return self.deny(v, d, info)
        flask.g.rate_limit = d
        charge, token = open_charge()
        headers = v.headers

        @flask.after_this_request
        def finish(resp: flask.Response) -> flask.Response:
            close_charge(token)
            for k, val in headers.items():
                resp.headers.setdefault(k, val)
            self.settle(p, d, resp.status_code, charge)
            return resp

        return None

    def settle(self, p: Plan, d: Decision, status: int, charge: Any) -> None:
        reported = reported_cost(charge, flask.g.get("rate_limit_cost"))
        settle(self.limiter, p, d, status, reported, self.gate.deduct_when)

    def deny(self, v: Verdict, d: Decision | None, info: RequestInfo) -> Any:
        denial = self.gate.denial(v, d, info)
        if self.gate.on_denied is not None:
            custom = self.gate.on_denied(denial)
            if inspect.isawaitable(custom):
                raise TypeError("on_denied of a Flask integration must not be a coroutine function")
            if custom is not None:
                resp = flask.make_response(custom if not isinstance(custom, Verdict) else (custom.body, custom.status or v.status, custom.headers))
                for k, val in denial.limit_headers.items():
                    resp.headers.setdefault(k, val)
                return resp
        ours = denial.limit_headers

        @flask.after_this_request
        def keep_fields(resp: SansIOResponse) -> SansIOResponse:
            # The app's errorhandler(429) response keeps Retry-After and the RateLimit
            # fields, unless it set them itself.
            for k, val in ours.items():
                resp.headers.setdefault(k, val)
            return resp

        raise _CLASSES.get(v.status or 503, LimiterClosed)(denial)


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
    user: Callable[[dict[str, Any]], str | None] = flask_user,
    trusted_proxies: Iterable[str] = (),
    forwarded_header: str = "X-Forwarded-For",
    ipv6_prefix: int = 64,
    on_denied: OnDenied | None = None,
    degraded_status: int = 503,
    prefix: str = "",
    exempt_preflight: bool = True,
) -> Callable[[F], F]:
    """rate_limit limits one Flask view (the parameters of `redis_rl.http.Rule` for the limit,
    of `redis_rl.http.Gate` for the rest): the RateLimit fields on every admitted response; a
    denial raises RateLimitExceeded (429) and its kin for `@app.errorhandler`, or answers
    `on_denied`'s response."""
    rule = Rule("*", limits, key=key, name=name, cost=cost, hash_tag=hash_tag, algorithm=algorithm)
    gate = Gate(
        [rule], exempt=list(exempt), exempt_when=exempt_when, deduct_when=deduct_when,
        missing=missing, x_headers=x_headers, trusted_proxies=trusted_proxies,
        forwarded_header=forwarded_header, ipv6_prefix=ipv6_prefix, on_denied=on_denied,
        degraded_status=degraded_status, prefix=prefix, exempt_preflight=exempt_preflight,
    )
    steps = _Flask(limiter, gate, user)

    def deco(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            answer = steps.run(rule)
            if answer is not None:
                return answer
            return view(*args, **kwargs)

        return cast(F, wrapper)

    return deco


class RateLimits:
    """RateLimits applies `rules` to every request of a Flask app (first match wins), inside
    the app: a denial raises RateLimitExceeded (429) and its kin, so `@app.errorhandler(429)`
    answers it (the package's JSON answer otherwise). Requests that no rule matches, and the
    exempt ones, make no Redis call.

        limits = RateLimits(app, limiter, rules=[...])   # or RateLimits(...).init_app(app)

    The parameters are those of every integration (see `redis_rl.http.Gate`); `user` reads
    the user (default `flask.g.user_id`, else REMOTE_USER).
    """

    def __init__(
        self,
        app: flask.Flask | None = None,
        limiter: Limiter | None = None,
        rules: Iterable[Rule] = (),
        *,
        exempt: Iterable[PathPattern] = (),
        exempt_when: Callable[[RequestInfo], bool] | None = None,
        deduct_when: Callable[[int], bool] | None = None,
        missing: Missing = "ip",
        x_headers: bool = False,
        user: Callable[[dict[str, Any]], str | None] = flask_user,
        trusted_proxies: Iterable[str] = (),
        forwarded_header: str = "X-Forwarded-For",
        ipv6_prefix: int = 64,
        on_denied: OnDenied | None = None,
        degraded_status: int = 503,
        prefix: str = "",
        exempt_preflight: bool = True,
    ) -> None:
        if limiter is None:
            raise TypeError("RateLimits needs a limiter")
        self.limiter = limiter
        self.gate = Gate(
            list(rules), exempt=list(exempt), exempt_when=exempt_when, deduct_when=deduct_when,
            missing=missing, x_headers=x_headers, trusted_proxies=trusted_proxies,
            forwarded_header=forwarded_header, ipv6_prefix=ipv6_prefix, on_denied=on_denied,
            degraded_status=degraded_status, prefix=prefix, exempt_preflight=exempt_preflight,
        )
        self._steps = _Flask(limiter, self.gate, user)
        if app is not None:
            self.init_app(app)

    def init_app(self, app: flask.Flask) -> None:
        """init_app installs the limits on `app` (a before_request function)."""
        app.before_request(self._before)

    def _before(self) -> Any:
        return self._steps.run(None)
