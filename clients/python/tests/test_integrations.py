"""Every integration takes the same parameters and keeps them the same way
(docs/clients.md#web-middleware): the ASGI and WSGI middleware, the Starlette decorator, the
FastAPI dependency, the Flask decorator and app-wide RateLimits, Django's decorator and
middleware. Each is driven through one harness against a real server in both modes:
`deduct_when` on the status actually sent, a cost the handler reports (refund or FORCE),
`exempt_when`, `missing`, `on_denied`, `x_headers`, `prefix`; and the denial answered the
framework's way (Flask's errorhandler(429), Starlette/FastAPI exception handlers)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import flask
import httpx
import pytest
import redis.asyncio as aredis
from django.conf import settings
from fastapi import Response as FResponse
from starlette.requests import Request

from redis_rl import GCRA, AsyncLimiter, Limiter, Window
from redis_rl.http import Denial, Rule, client_ip, header, report_cost

from .conftest import RedisServer

if not settings.configured:  # as test_frameworks configures it (whichever is imported first)
    settings.configure(
        DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF="tests.test_frameworks",
        MIDDLEWARE=["redis_rl.django.RateLimitMiddleware"], REDIS_RL={}, INSTALLED_APPS=[],
        SECRET_KEY="test-only",
    )
    import django

    django.setup()

LIMIT = Window(2, 60)
NAME = "thing"
INTEGRATIONS = [
    "asgi", "starlette-decorator", "fastapi-dependency", "wsgi", "flask-decorator",
    "flask-app", "django-decorator", "django-middleware",
]
COMMON = {
    "exempt", "exempt_when", "deduct_when", "missing", "x_headers", "trusted_proxies",
    "forwarded_header", "ipv6_prefix", "on_denied", "degraded_status", "prefix",
    "exempt_preflight",
}

Get = Callable[..., Awaitable[tuple[int, dict[str, str], bytes]]]


@dataclass
class Harness:
    get: Get  # get(path, headers) -> (status, headers, body)
    sync: Limiter  # a limiter on the same server and prefix, to look at the keys
    close: Callable[[], Awaitable[None]]


# The app every integration limits: /thing answers ?status=N (default 200), reports
# ?cost=N with report_cost (or ?place=1: the framework's own place), and ?boom=1 raises.


def _status(params: Any) -> int:
    return int(params.get("status", "200"))


async def make(kind: str, server: RedisServer, key_prefix: str, **kw: Any) -> Harness:
    """make builds the integration `kind` around the app, with the integration's parameters
    `kw`, on a limiter whose keys start with `key_prefix`."""
    prefix = key_prefix
    sync = Limiter(server.client(), prefix=prefix)
    rule_kw: dict[str, Any] = {"key": header("X-API-Key"), "name": NAME}
    if kind in ("asgi", "starlette-decorator", "fastapi-dependency"):
        return await _asgi_kind(kind, server, prefix, sync, rule_kw, kw)
    return _wsgi_kind(kind, server, prefix, sync, rule_kw, kw)


async def _asgi_kind(kind: str, server: RedisServer, prefix: str, sync: Limiter,
                     rule_kw: dict[str, Any], kw: dict[str, Any]) -> Harness:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    aclient = getattr(server, "aclient", None)
    client = aclient() if aclient is not None else aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client, prefix=prefix)

    def answer(params: Any, state: Any) -> Response:
        if params.get("boom"):
            raise RuntimeError("boom")
        if "cost" in params:
            if params.get("place"):
                state.rate_limit_cost = int(params["cost"])
            else:
                report_cost(int(params["cost"]))
        return JSONResponse({"ok": True}, status_code=_status(params))

    app: Any
    if kind == "asgi":
        async def thing(request: Request) -> Response:
            return answer(request.query_params, request.state)

        from redis_rl.asgi import RateLimitMiddleware

        app = Starlette(routes=[Route("/thing", thing)], middleware=[
            Middleware(RateLimitMiddleware, limiter=lim, rules=[Rule("/thing", LIMIT, **rule_kw)], **kw)])
    elif kind == "starlette-decorator":
        from redis_rl.starlette import rate_limit

        @rate_limit(lim, LIMIT, **rule_kw, **kw)
        async def thing2(request: Request) -> Response:
            return answer(request.query_params, request.state)

        app = Starlette(routes=[Route("/thing", thing2)])
    else:
        from fastapi import Depends, FastAPI

        from redis_rl.starlette import RateLimit, RateLimitDenied, exception_handler

        api = FastAPI()
        api.add_exception_handler(RateLimitDenied, exception_handler)
        dep = RateLimit(lim, LIMIT, **rule_kw, **kw)

        @api.get("/thing", dependencies=[Depends(dep)])
        async def thing3(request: Request, response: FResponse) -> dict[str, bool]:
            params = request.query_params
            if params.get("boom"):
                raise RuntimeError("boom")
            if "cost" in params:
                if params.get("place"):
                    request.state.rate_limit_cost = int(params["cost"])
                else:
                    report_cost(int(params["cost"]))
            response.status_code = _status(params)
            return {"ok": True}

        app = api
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    http = httpx.AsyncClient(transport=transport, base_url="http://t")

    async def get(path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        r = await http.get(path, headers=headers or {})
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content

    async def close() -> None:
        await http.aclose()
        await lim.aclose()
        await lim.redis.aclose()
        sync.close()

    return Harness(get, sync, close)


def _wsgi_kind(kind: str, server: RedisServer, prefix: str, sync: Limiter,
               rule_kw: dict[str, Any], kw: dict[str, Any]) -> Harness:
    lim = Limiter(server.client(), prefix=prefix)
    if kind.startswith("django"):
        return _django_kind(kind, lim, sync, rule_kw, kw)
    app = flask.Flask(f"h-{kind}")

    def view() -> Any:
        params = flask.request.args
        if params.get("boom"):
            raise RuntimeError("boom")
        if "cost" in params:
            if params.get("place"):
                if kind == "wsgi":
                    flask.request.environ["redis_rl.cost"] = int(params["cost"])
                else:
                    flask.g.rate_limit_cost = int(params["cost"])
            else:
                report_cost(int(params["cost"]))
        return {"ok": True}, _status(params)

    if kind == "wsgi":
        from redis_rl.wsgi import RateLimitMiddleware

        app.get("/thing")(view)
        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, lim, [Rule("/thing", LIMIT, **rule_kw)], **kw)  # type: ignore[method-assign]
    elif kind == "flask-decorator":
        from redis_rl.flask import rate_limit

        app.get("/thing")(rate_limit(lim, LIMIT, **rule_kw, **kw)(view))
    else:
        from redis_rl.flask import RateLimits

        app.get("/thing")(view)
        RateLimits(app, lim, [Rule("/thing", LIMIT, **rule_kw)], **kw)
    c = app.test_client()

    async def get(path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        r = c.get(path, headers=headers or {})
        body = r.get_data()
        r.close()
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, body

    async def close() -> None:
        lim.close()
        sync.close()

    return Harness(get, sync, close)


_django: dict[str, Any] = {}


def _django_view(request: Any) -> Any:
    from django.http import JsonResponse

    params = request.GET
    if params.get("boom"):
        raise RuntimeError("boom")
    if "cost" in params:
        if params.get("place"):
            request.rate_limit_cost = int(params["cost"])
        else:
            report_cost(int(params["cost"]))
    return JsonResponse({"ok": True}, status=_status(params))


def _decorated(request: Any) -> Any:
    return _django["view"](request)


def _django_kind(kind: str, lim: Limiter, sync: Limiter, rule_kw: dict[str, Any], kw: dict[str, Any]) -> Harness:
    from django.test import Client, override_settings
    from django.urls import path

    from redis_rl.django import rate_limit

    if kind == "django-decorator":
        _django["view"] = rate_limit(lim, LIMIT, **rule_kw, **kw)(_django_view)
        middleware: list[str] = []
        cfg: dict[str, Any] = {}
        urls = [path("thing", _decorated)]
    else:
        middleware = ["redis_rl.django.RateLimitMiddleware"]
        cfg = {"limiter": lim, "rules": [Rule("/thing", LIMIT, **rule_kw)], **kw}
        urls = [path("thing", _django_view)]
    module = type("urls", (), {"urlpatterns": urls})
    override = override_settings(ROOT_URLCONF=module, MIDDLEWARE=middleware, REDIS_RL=cfg, DEBUG_PROPAGATE_EXCEPTIONS=False)
    override.enable()
    c = Client(raise_request_exception=False)

    async def get(p: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        r = c.get(p, headers=headers or {})
        return r.status_code, {k.lower(): v for k, v in r.items()}, r.content

    async def close() -> None:
        override.disable()
        lim.close()
        sync.close()

    return Harness(get, sync, close)


def remaining(h: Harness, api_key: str, prefix_kw: str = "") -> int:
    return h.sync.check(f"{prefix_kw}{NAME}:{{hdr.x-api-key:{api_key}}}", LIMIT, 0).remaining


@pytest.fixture(params=INTEGRATIONS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- the same parameters ----------------------------------------------------------------------


def test_every_integration_takes_the_same_parameters() -> None:
    from redis_rl import asgi, django, flask as rl_flask, starlette, wsgi

    for target in (asgi.RateLimitMiddleware, wsgi.RateLimitMiddleware, starlette.RateLimit,
                   starlette.rate_limit, rl_flask.rate_limit, rl_flask.RateLimits, django.rate_limit):
        params = set(inspect.signature(target).parameters)
        assert COMMON <= params, (target, COMMON - params)
        assert "user" in params or target is django.rate_limit, target  # Django reads request.user
    for decorator in (starlette.RateLimit, starlette.rate_limit, rl_flask.rate_limit, django.rate_limit):
        params = set(inspect.signature(decorator).parameters)
        assert {"limits", "key", "name", "cost", "missing", "hash_tag", "algorithm"} <= params
    # Django's middleware takes them from settings.REDIS_RL, by the same names.
    assert set(django._GATE_OPTIONS) == COMMON


# -- deduct_when, the reported cost, exempt_when, missing, x_headers, prefix --------------------


async def test_deduct_when_decides_on_the_status_sent(kind: str, server: RedisServer, prefix: str) -> None:
    h = await make(kind, server, prefix, deduct_when=lambda status: status < 400)
    try:
        k = {"X-API-Key": "d"}
        assert (await h.get("/thing?status=404", k))[0] == 404
        assert remaining(h, "d") == 2  # refunded: a 404 is not charged
        assert (await h.get("/thing?boom=1", k))[0] == 500
        assert remaining(h, "d") == 2  # an error is a 500 sent: refunded too
        assert (await h.get("/thing", k))[0] == 200
        assert remaining(h, "d") == 1  # charged
    finally:
        await h.close()


async def test_a_reported_cost_settles_the_charge(kind: str, server: RedisServer, prefix: str) -> None:
    h = await make(kind, server, prefix)
    try:
        k = {"X-API-Key": "c"}
        assert (await h.get("/thing?cost=0", k))[0] == 200
        assert remaining(h, "c") == 2  # reported 0: the unit charged up front is refunded
        assert (await h.get("/thing?cost=2&place=1", k))[0] == 200  # the framework's own place
        assert remaining(h, "c") == 0  # reported 2: the extra unit is recorded (FORCE)
        status, _, _ = await h.get("/thing", k)
        assert status == 429
    finally:
        await h.close()


async def test_exempt_when_and_missing_and_x_headers_and_prefix(kind: str, server: RedisServer, prefix: str) -> None:
    h = await make(kind, server, prefix, exempt_when=lambda info: "x-internal" in info.headers,
                   missing="deny", x_headers=True, prefix="app1:")
    try:
        status, headers, _ = await h.get("/thing", {"X-Internal": "1"})
        assert status == 200 and "ratelimit" not in headers and h.sync.counters["redis_calls"] == 0
        status, _, body = await h.get("/thing")
        assert status == 401 and b"identity_required" in body
        status, headers, _ = await h.get("/thing", {"X-API-Key": "p"})
        assert status == 200 and headers["x-ratelimit-remaining"] == "1"
        assert remaining(h, "p", "app1:") == 1  # the integration's prefix is in the key
    finally:
        await h.close()


async def test_on_denied_answers_and_keeps_the_fields(kind: str, server: RedisServer, prefix: str) -> None:
    seen: list[Denial] = []

    def on_denied(denial: Denial) -> Any:
        seen.append(denial)
        body = json.dumps({"custom": denial.error, "wait": denial.headers.get("Retry-After")})
        if kind.startswith("django"):
            from django.http import HttpResponse

            return HttpResponse(body, status=429, content_type="application/json")
        if kind in ("wsgi",):
            from werkzeug.wrappers import Response as WResponse

            return WResponse(body, 429, content_type="application/json")
        if kind.startswith("flask"):
            return flask.Response(body, 429, content_type="application/json")
        from starlette.responses import Response

        return Response(body, 429, media_type="application/json")

    h = await make(kind, server, prefix, on_denied=on_denied)
    try:
        k = {"X-API-Key": "o"}
        for _ in range(2):
            assert (await h.get("/thing", k))[0] == 200
        status, headers, body = await h.get("/thing", k)
        assert status == 429
        assert json.loads(body)["custom"] == "rate_limited"
        assert "retry-after" in headers and headers["ratelimit"].startswith('"thing";r=0;t=')
        assert len(seen) == 1 and seen[0].decision is not None and not seen[0].decision.allowed
    finally:
        await h.close()


async def test_an_open_degraded_answer_carries_no_ratelimit_fields_in_every_integration(kind: str) -> None:
    # docs/clients.md#closed-policy: Redis unreachable, the failure policy "open" admits with
    # no RateLimit field (RateLimit-Policy was sent), whichever integration answers.
    from .conftest import free_port

    class Nowhere:
        port = free_port()  # nothing listens here

        def client(self) -> Any:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            return redis.Redis(host="127.0.0.1", port=self.port, retry=Retry(NoBackoff(), 0))

        def aclient(self) -> Any:
            from redis.asyncio.retry import Retry as ARetry
            from redis.backoff import NoBackoff

            return aredis.Redis(host="127.0.0.1", port=self.port, retry=ARetry(NoBackoff(), 0))

    h = await make(kind, Nowhere(), "nowhere:", x_headers=True)  # type: ignore[arg-type]
    try:
        status, headers, _ = await h.get("/thing", {"X-API-Key": "d"})
        assert status == 200
        assert not [k for k in headers if "ratelimit" in k], headers
    finally:
        await h.close()


async def test_a_listed_header_is_one_key_in_every_integration(kind: str, server: RedisServer, prefix: str) -> None:
    # Repeated X-API-Key lines reached the WSGI apps joined with "," (key a%2Cb) and the ASGI
    # ones with ", " (a%2C%20b): one request, two buckets depending on the server. The header
    # key function reads the value as a list and spells it "a, b" everywhere, as the Rust
    # crate does.
    h = await make(kind, server, prefix)
    try:
        for value in ("a,b", " a ,\tb "):
            assert (await h.get("/thing", {"X-API-Key": value}))[0] == 200
        assert (await h.get("/thing", {"X-API-Key": "a, b"}))[0] == 429
        assert {k.decode() for k in h.sync.redis.keys(prefix + "*")} == {f"{prefix}{NAME}:{{hdr.x-api-key:a%2C%20b}}"}
    finally:
        await h.close()


async def test_one_limit_name_for_two_different_limits_is_refused(server: RedisServer, prefix: str) -> None:
    # A limit's name is its bucket's name: a 5/minute "/two/" rule named its per-IP part "ip"
    # like the 100/minute "/api/" rule, so it answered 429 at once once /api/ had filled
    # ip:{ip:…} (and two algorithms on one key answer an error, a 500). Every integration
    # refuses such rules when it is built, naming both rules and the name.
    from django.test import override_settings

    from redis_rl.asgi import RateLimitMiddleware as AsgiMiddleware
    from redis_rl.django import RateLimitMiddleware as DjangoMiddleware
    from redis_rl.flask import RateLimits
    from redis_rl.wsgi import RateLimitMiddleware as Wsgi

    async def _app(scope: Any, receive: Any, send: Any) -> None:
        pass

    clashes = [
        [Rule("/api/", {"ip": ("100/minute", client_ip()), "key": ("1000/minute", header("X-API-Key"))}),
         Rule("/two/", {"ip": ("5/minute", client_ip())})],
        [Rule("/a", GCRA(5, 1, 60), key=client_ip(), name="same"),
         Rule("/b", Window(5, 60), key=header("X-API-Key"), name="same")],
        [Rule("/x/", "10/minute; 100 per hour", key=client_ip(), name="x"),
         Rule("/y/", "20/minute", key=client_ip(), name="x-60s", methods=["POST"])],
    ]
    lim = Limiter(server.client(), prefix=prefix)
    alim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
    try:
        for rules in clashes:
            builders: list[Any] = [
                lambda: AsgiMiddleware(_app, alim, rules),
                lambda: Wsgi(flask.Flask("c").wsgi_app, lim, rules),
                lambda: RateLimits(flask.Flask("c"), lim, rules),
            ]
            for build in builders:
                with pytest.raises(ValueError, match="limit name") as e:
                    build()
                first, second = rules
                assert repr(first.path) in str(e.value) and repr(second.path) in str(e.value)
            with override_settings(REDIS_RL={"limiter": lim, "rules": rules}):
                with pytest.raises(ValueError, match="limit name"):
                    DjangoMiddleware(lambda request: None)
        with pytest.raises(ValueError) as e:
            Wsgi(flask.Flask("c").wsgi_app, lim, clashes[0])
        assert str(e.value).startswith(
            "the limit name 'ip' is given to two different limits: WINDOW 100 60 SLIDING in "
            "Rule('/api/') and WINDOW 5 60 SLIDING in Rule('/two/')")
    finally:
        lim.close()
        await alim.redis.aclose()


@pytest.mark.parametrize("flavor", ["asgi", "wsgi"])
async def test_a_reported_cost_beyond_the_arithmetic_records_the_most_it_holds(
    server: RedisServer, prefix: str, flavor: str
) -> None:
    # A reported 2^64 − 1 on a GCRA limit (and on a FIXED window already counting other
    # requests) overflowed the FORCE: nothing was recorded, only a log line. Now the most
    # the limit's arithmetic holds is recorded (the key used up for as long as it can be)
    # and it is counted in errors.
    from datetime import timedelta

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware as Asgi
    from redis_rl.wsgi import RateLimitMiddleware as Wsgi

    huge = 2**64 - 1
    rules = [Rule("/g", GCRA(5, 1, 60), key=header("X-API-Key"), name="g"),
             Rule("/f", Window(5, 60, "FIXED"), key=header("X-API-Key"), name="f")]
    sync = Limiter(server.client(), prefix=prefix)
    get: Any
    if flavor == "asgi":
        lim: Any = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)

        async def view(request: Request) -> Response:
            if "cost" in request.query_params:
                report_cost(int(request.query_params["cost"]))
            return JSONResponse({"ok": True})

        app = Starlette(routes=[Route("/g", view), Route("/f", view)],
                        middleware=[Middleware(Asgi, limiter=lim, rules=rules)])
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

        async def get(path: str) -> int:
            return (await http.get(path, headers={"X-API-Key": "k"})).status_code
    else:
        lim = Limiter(server.client(), prefix=prefix)
        fapp = flask.Flask("huge")

        def fview() -> Any:
            if "cost" in flask.request.args:
                report_cost(int(flask.request.args["cost"]))
            return {"ok": True}

        fapp.get("/g")(fview)
        fapp.get("/f", endpoint="f")(fview)
        fapp.wsgi_app = Wsgi(fapp.wsgi_app, lim, rules)  # type: ignore[method-assign]
        c = fapp.test_client()

        async def get(path: str) -> int:
            return c.get(path, headers={"X-API-Key": "k"}).status_code
    try:
        assert await get(f"/g?cost={huge}") == 200
        g = sync.check("g:{hdr.x-api-key:k}", GCRA(5, 1, 60), 0, peek=True)
        assert g.remaining == 0 and g.reset_after > timedelta(days=365 * 400), g  # till ~2554
        assert await get("/g") == 429
        assert [await get("/f") for _ in range(2)] == [200, 200]
        assert await get(f"/f?cost={huge}") == 200  # 3 + (2^64 − 2) passes 2^64 − 1
        f = sync.check("f:{hdr.x-api-key:k}", Window(5, 60, "FIXED"), 0, peek=True)
        assert f.remaining == 0 and await get("/f") == 429
        assert lim.counters["errors"] == 2  # one per reported cost not recorded in full
        assert lim.counters["degraded"] == 0
    finally:
        if flavor == "asgi":
            await http.aclose()
            await lim.aclose()
            await lim.redis.aclose()
        else:
            lim.close()
        sync.close()


# -- the framework's own ways -------------------------------------------------------------------


def test_flask_errorhandler_429_is_called(server: RedisServer, prefix: str) -> None:
    # redis_rl used to answer its own JSON: the app's errorhandler(429) was never called.
    from redis_rl.flask import RateLimitExceeded, RateLimits, rate_limit

    lim = Limiter(server.client(), prefix=prefix)
    app = flask.Flask("eh")
    called: list[Any] = []

    @app.errorhandler(429)
    def too_many(e: Any) -> Any:
        called.append(e)
        return {"sorry": True}, 429

    @app.get("/view")
    @rate_limit(lim, "1/minute", key=header("X-API-Key"), name="view")
    def view() -> Any:
        return {"ok": True}

    @app.get("/wide")
    def wide() -> Any:
        return {"ok": True}

    RateLimits(app, lim, [Rule("/wide", "1/minute", key=header("X-API-Key"), name="wide")])
    c = app.test_client()
    for path in ("/view", "/wide"):
        assert c.get(path, headers={"X-API-Key": "e"}).status_code == 200
        r = c.get(path, headers={"X-API-Key": "e"})
        assert r.status_code == 429 and r.get_json() == {"sorry": True}
        assert "Retry-After" in r.headers and r.headers["RateLimit"].startswith(f'"{path[1:]}";r=0')
    assert len(called) == 2 and all(isinstance(e, RateLimitExceeded) for e in called)
    assert called[0].decision is not None and called[0].description == "rate_limited"
    # Without a handler of the app's, the package's JSON answer.
    plain = flask.Flask("plain")

    @plain.get("/v")
    @rate_limit(lim, "1/minute", key=header("X-API-Key"), name="v")
    def v() -> Any:
        return {"ok": True}

    pc = plain.test_client()
    pc.get("/v", headers={"X-API-Key": "e"})
    r = pc.get("/v", headers={"X-API-Key": "e"})
    assert r.status_code == 429 and r.get_json()["error"] == "rate_limited"
    lim.close()


async def test_starlette_and_fastapi_exception_handlers_are_called(server: RedisServer, prefix: str) -> None:
    from fastapi import Depends, FastAPI
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from redis_rl.starlette import RateLimit, RateLimitExceeded, rate_limit

    lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
    # The decorator takes x_headers and user like every integration (it lacked them).
    deco = rate_limit(lim, "1/minute", key=header("X-API-Key"), name="s", x_headers=True,
                      user=lambda scope: None)

    @deco
    async def endpoint(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def by_status(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RateLimitExceeded) and exc.decision is not None
        return JSONResponse({"handled": "starlette"}, status_code=429, headers=exc.headers)

    star = Starlette(routes=[Route("/s", endpoint)], exception_handlers={429: by_status})
    api = FastAPI()

    @api.exception_handler(RateLimitExceeded)
    async def by_class(request: Request, exc: RateLimitExceeded) -> Response:
        return JSONResponse({"handled": "fastapi", "error": exc.denial.error}, status_code=429)

    @api.get("/f", dependencies=[Depends(RateLimit(lim, "1/minute", key=header("X-API-Key"), name="f"))])
    async def f() -> dict[str, bool]:
        return {"ok": True}

    try:
        for app, path, handled in ((star, "/s", "starlette"), (api, "/f", "fastapi")):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                first = await c.get(path, headers={"X-API-Key": "x"})
                second = await c.get(path, headers={"X-API-Key": "x"})
            assert first.status_code == 200 and second.status_code == 429
            assert second.json()["handled"] == handled
            if path == "/s":
                assert first.headers["X-RateLimit-Remaining"] == "0"
                assert "Retry-After" in second.headers
    finally:
        await lim.aclose()
        await lim.redis.aclose()


async def test_an_asgi_request_whose_client_went_away_stays_charged(server: RedisServer, prefix: str) -> None:
    from redis_rl.asgi import RateLimitMiddleware

    async def gone(scope: Any, receive: Any, send: Any) -> None:
        return None  # no response sent: the client went away before a status

    lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
    sync = Limiter(server.client(), prefix=prefix)
    app = RateLimitMiddleware(gone, lim, [Rule("/", LIMIT, key=header("X-API-Key"), name=NAME)],
                              deduct_when=lambda status: False)
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"x-api-key", b"g")],
             "client": ("127.0.0.1", 1)}
    try:
        await app(scope, receive, send)
        assert sent == []
        assert sync.check(f"{NAME}:{{hdr.x-api-key:g}}", LIMIT, 0).remaining == 1  # stays charged
    finally:
        await lim.aclose()
        await lim.redis.aclose()
        sync.close()


async def test_the_charge_is_settled_before_the_response_goes_on(server: RedisServer, prefix: str) -> None:
    # Whoever reads Redis once the response has started (a client sending its next request
    # to another process) sees the refund already: the ASGI middleware settles before it
    # passes the response start on, the WSGI middleware before it calls the server's
    # start_response.
    from redis_rl.asgi import RateLimitMiddleware as Asgi
    from redis_rl.wsgi import RateLimitMiddleware as Wsgi

    async def not_found(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})

    def wsgi_not_found(environ: Any, start_response: Any) -> list[bytes]:
        start_response("404 Not Found", [])
        return [b"no"]

    lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
    sync = Limiter(server.client(), prefix=prefix)
    rules = [Rule("/", LIMIT, key=header("X-API-Key"), name=NAME)]
    seen: list[int] = []
    try:
        app = Asgi(not_found, lim, rules, deduct_when=lambda status: status < 400)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                seen.append(sync.check(f"{NAME}:{{hdr.x-api-key:a}}", LIMIT, 0).remaining)

        scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"x-api-key", b"a")],
                 "client": ("127.0.0.1", 1)}
        await app(scope, receive, send)

        wapp = Wsgi(wsgi_not_found, sync, rules, deduct_when=lambda status: status < 400)

        def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
            seen.append(sync.check(f"{NAME}:{{hdr.x-api-key:w}}", LIMIT, 0).remaining)

        body = wapp({"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "127.0.0.1",
                     "HTTP_X_API_KEY": "w"}, start_response)
        assert list(body) == [b"no"]
        assert seen == [2, 2]  # refunded before the response went on
    finally:
        await lim.aclose()
        await lim.redis.aclose()
        sync.close()
