"""The framework adapters in process, against a real server in both modes: the Starlette
decorator, the FastAPI dependency, Django's middleware and view decorator, the Flask
decorator, and the middleware's "closed" answer (503) when Redis cannot be reached."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from django.conf import settings

from redis_rl import GCRA, AsyncLimiter, Limiter, Window
from redis_rl.http import Rule, client_ip, header, user

from .conftest import RedisServer, free_port, retry_after_within

if not settings.configured:
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=["redis_rl.django.RateLimitMiddleware"],
        REDIS_RL={},
        INSTALLED_APPS=[],
        SECRET_KEY="test-only",
    )
    import django

    django.setup()

from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

from redis_rl.django import rate_limit as django_rate_limit  # noqa: E402

_django_limiter: dict[str, Limiter] = {}


def _view(request: Any) -> Any:
    d = getattr(request, "rate_limit", None)
    return JsonResponse({"ok": True, "remaining": None if d is None else d.remaining})


def _decorated(request: Any) -> Any:
    return django_rate_limit(_django_limiter["l"], GCRA(1, 1, 60, name="one"), key=client_ip())(_view)(request)


urlpatterns = [path("api/x", _view), path("health", _view), path("one", _decorated)]


def test_django_middleware_and_decorator(server: RedisServer, prefix: str) -> None:
    from django.test import Client

    lim = Limiter(server.client(), prefix=prefix)
    _django_limiter["l"] = lim
    settings.REDIS_RL = {
        "limiter": lim,
        "rules": [Rule("/api/", GCRA(2, 1, 60, name="api"), key=client_ip())],
        "exempt": ["/health"],
    }
    c = Client()
    start = time.monotonic()
    got = [c.get("/api/x") for _ in range(3)]
    assert [g.status_code for g in got] == [200, 200, 429]
    assert got[0]["RateLimit-Policy"] == '"api";q=2;w=120'
    # The view saw each admitted request's decision.
    assert [json.loads(g.content)["remaining"] for g in got[:2]] == [1, 0]
    assert retry_after_within(got[2]["Retry-After"], 60, start)
    assert json.loads(got[2].content)["error"] == "rate_limited"
    assert "RateLimit" not in c.get("/health")
    settings.REDIS_RL = {"limiter": lim, "rules": []}
    one = [Client().get("/one") for _ in range(2)]
    assert [g.status_code for g in one] == [200, 429]
    assert json.loads(one[0].content)["remaining"] == 0
    assert one[0]["RateLimit"].startswith('"one";r=0;t=')
    lim.close()


def test_flask_decorator_with_the_user_key(server: RedisServer, prefix: str) -> None:
    import flask

    from redis_rl.flask import rate_limit

    lim = Limiter(server.client(), prefix=prefix)
    app = flask.Flask("t")

    @app.before_request
    def login() -> None:
        flask.g.user_id = flask.request.headers.get("X-User")

    @app.get("/r")
    @rate_limit(lim, Window(2, 60, "FIXED", name="per-user"), key=user())
    def r() -> Any:
        d = flask.g.get("rate_limit")
        return {"ok": True, "remaining": None if d is None else d.remaining}

    c = app.test_client()
    u1 = [c.get("/r", headers={"X-User": "u1"}) for _ in range(3)]
    assert [g.status_code for g in u1] == [200, 200, 429]
    assert [g.get_json()["remaining"] for g in u1[:2]] == [1, 0]
    assert c.get("/r", headers={"X-User": "u2"}).status_code == 200
    # An anonymous request has no user key: the limit applies to its client IP instead
    # (docs/clients.md#a-missing-identity-is-never-no-limit), apart from every user's.
    assert [c.get("/r").status_code for _ in range(3)] == [200, 200, 429]
    lim.close()


async def test_starlette_decorator_and_fastapi_dependency(server: RedisServer, prefix: str) -> None:
    from fastapi import Depends, FastAPI
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from redis_rl.starlette import RateLimit, rate_limit

    lim = AsyncLimiter(__import__("redis.asyncio", fromlist=["Redis"]).Redis(port=server.port), prefix=prefix)

    @rate_limit(lim, GCRA(1, 1, 60, name="login"), key=client_ip())
    async def login(request: Request) -> Response:
        return JSONResponse({"ok": True, "remaining": request.state.rate_limit.remaining})

    star = Starlette(routes=[Route("/login", login)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=star), base_url="http://t") as c:
        first, second = await c.get("/login"), await c.get("/login")
        assert (first.status_code, second.status_code) == (200, 429)
        assert first.headers["RateLimit"].startswith('"login";r=0')
        assert second.json()["policy"] == "login"
        assert first.json() == {"ok": True, "remaining": 0}

    api = FastAPI()
    dep = RateLimit(lim, GCRA(2, 1, 60, name="items"), key=header("X-API-Key", "anon"))

    @api.get("/items", dependencies=[Depends(dep)])
    async def items() -> dict[str, bool]:
        return {"ok": True}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as c:
        start = time.monotonic()
        got = [await c.get("/items") for _ in range(3)]
        assert [g.status_code for g in got] == [200, 200, 429]
        assert got[1].headers["RateLimit"].startswith('"items";r=0')
        assert retry_after_within(got[2].headers["Retry-After"], 60, start)
        assert got[2].json()["detail"]["error"] == "rate_limited"
    await lim.aclose()
    await lim.redis.aclose()


async def test_middleware_closed_policy_answers_503_when_redis_is_unreachable() -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    nothing = free_port()  # nothing listens here
    lim = AsyncLimiter.from_url(f"redis://127.0.0.1:{nothing}/0", timeout=0.2, on_error="closed")
    app = RateLimitMiddleware(Starlette(routes=[Route("/", home)]), lim,
                              [Rule("/", GCRA(5, 1, 1, name="g"), key=client_ip())])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.get("/")
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.json()["error"] == "limiter_unavailable"
    open_lim = AsyncLimiter.from_url(f"redis://127.0.0.1:{nothing}/0", timeout=0.2, on_error="open")
    app2 = RateLimitMiddleware(Starlette(routes=[Route("/", home)]), open_lim,
                               [Rule("/", GCRA(5, 1, 1, name="g"), key=client_ip())])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app2), base_url="http://t") as c:
        r = await c.get("/")
        assert r.status_code == 200 and r.text == "ok"
        assert "RateLimit-Policy" not in r.headers and "RateLimit" not in r.headers
    assert lim.counters["degraded"] == 1 and open_lim.counters["degraded"] == 1
    await lim.redis.aclose()
    await open_lim.redis.aclose()


async def test_degraded_answers_carry_no_ratelimit_fields() -> None:
    # docs/clients.md#closed-policy: the answers of the failure policies "open" and "closed"
    # carry no RateLimit fields (the open answer carried RateLimit-Policy), from
    # decision.headers() and from both middlewares, allowed and denied, with x_headers too.
    import flask
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware as Asgi
    from redis_rl.wsgi import RateLimitMiddleware as Wsgi

    fields = ("ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining",
              "x-ratelimit-reset")

    def limit_fields(headers: Any) -> list[str]:
        return [k for k in (k.lower() for k in dict(headers)) if k in fields]

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens here
    g, w = GCRA(5, 1, 1, name="g"), Window(3, 60, name="w")
    rules = [Rule("/", {"g": (g, client_ip()), "w": (w, header("X-API-Key"))})]
    for policy, status in (("open", 200), ("closed", 503)):
        sync = Limiter.from_url(url, timeout=0.2, on_error=policy)
        alim = AsyncLimiter.from_url(url, timeout=0.2, on_error=policy)
        try:
            for d in (sync.check("k", g), await alim.check("k", g),
                      sync.check_all({"a": g, "b": w}), await alim.check_all({"a": g, "b": w})):
                assert d.degraded and d.blind
                h = d.headers("p", x_headers=True) if not d.per_key else d.headers(x_headers=True)
                assert limit_fields(h) == [], (policy, h)
                assert list(h) == ([] if policy == "open" else ["Retry-After"])
            app = Asgi(Starlette(routes=[Route("/", home)]), alim, rules, x_headers=True)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                r = await c.get("/", headers={"X-API-Key": "a"})
            assert r.status_code == status and limit_fields(r.headers) == [], (policy, r.headers)
            fapp = flask.Flask("degraded")
            fapp.get("/")(lambda: "ok")
            fapp.wsgi_app = Wsgi(fapp.wsgi_app, sync, rules, x_headers=True)  # type: ignore[method-assign]
            wr = fapp.test_client().get("/", headers={"X-API-Key": "a"})
            assert wr.status_code == status and limit_fields(wr.headers) == [], (policy, wr.headers)
            if policy == "closed":
                assert r.headers["Retry-After"] == wr.headers["Retry-After"] == "1"
        finally:
            sync.close()
            sync.redis.close()
            await alim.aclose()
            await alim.redis.aclose()




async def test_the_middlewares_hand_the_decision_to_the_app(server: RedisServer, prefix: str) -> None:
    import flask
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware as AsgiMiddleware
    from redis_rl.wsgi import DECISION_ENVIRON_KEY
    from redis_rl.wsgi import RateLimitMiddleware as WsgiMiddleware

    async def home(request: Request) -> JSONResponse:
        d = getattr(request.state, "rate_limit", None)
        return JSONResponse({"remaining": None if d is None else d.remaining})

    alim = AsyncLimiter(__import__("redis.asyncio", fromlist=["Redis"]).Redis(port=server.port), prefix=prefix)
    rules = [Rule("/api", GCRA(3, 1, 60, name="a"), key=client_ip())]
    asgi = AsgiMiddleware(Starlette(routes=[Route("/api", home), Route("/free", home)]), alim, rules)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
        assert [(await c.get("/api")).json()["remaining"] for _ in range(3)] == [2, 1, 0]
        assert (await c.get("/free")).json() == {"remaining": None}  # no rule applied
    await alim.aclose()
    await alim.redis.aclose()

    lim = Limiter(server.client(), prefix=prefix + "w")
    app = flask.Flask("w")

    @app.get("/api")
    def api() -> Any:
        d = flask.request.environ.get(DECISION_ENVIRON_KEY)
        return {"remaining": None if d is None else d.remaining}

    app.wsgi_app = WsgiMiddleware(app.wsgi_app, lim, rules)  # type: ignore[method-assign]
    c = app.test_client()
    assert [c.get("/api").get_json()["remaining"] for _ in range(3)] == [2, 1, 0]
    lim.close()
