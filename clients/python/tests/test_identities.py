"""Identities stay apart, a missing identity is never "no limit", limits as users write them,
413 for every cost that can never pass, and the decided details of docs/clients.md (client
IP, routes, CORS preflights), through the ASGI and WSGI middleware against a real server in
both modes. (The Cluster half of the issue's reproduction is in test_cluster.py.)"""

from __future__ import annotations

from typing import Any

import flask
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from redis_rl import GCRA, AsyncLimiter, Limiter, Window
from redis_rl.asgi import RateLimitMiddleware as AsgiMiddleware
from redis_rl.http import Identity, RequestInfo, Rule, client_ip, custom_key, header, plan, route, user
from redis_rl.wsgi import RateLimitMiddleware as WsgiMiddleware

from .conftest import RedisServer

API_AND_IP = {
    "key": ("1000/minute", header("X-API-Key")),
    "ip": ("100/minute", client_ip()),
}


async def thing(request: Request) -> Response:
    return JSONResponse({"ok": True})


def starlette_app(limiter: AsyncLimiter, rules: list[Rule], **kw: Any) -> Any:
    """starlette_app is a Starlette app with the middleware added the usual way (inside the
    app, where the router's routes are known)."""
    return Starlette(
        routes=[
            Route("/api/thing", thing), Route("/users/{id}", thing), Route("/upload", thing, methods=["POST"]),
            Route("/free", thing), Route("/api/x", thing),
        ],
        middleware=[Middleware(AsgiMiddleware, limiter=limiter, rules=rules, **kw)],
    )


def async_limiter(server: RedisServer, prefix: str, **kw: Any) -> AsyncLimiter:
    import redis.asyncio as aredis

    return AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix, **kw)


async def close(lim: AsyncLimiter) -> None:
    await lim.aclose()
    await lim.redis.aclose()


def client(app: Any, peer: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 4321))
    return httpx.AsyncClient(transport=transport, base_url="http://t")


client_of = client  # for tests with a parameter named `client`


# -- identities stay apart (docs/clients.md#identities-stay-apart) ----------------------------


async def test_rotating_api_keys_cannot_pass_the_per_ip_limit_asgi(server: RedisServer, prefix: str) -> None:
    # The reproduction: 150 requests from one IP, each with a new X-API-Key, against
    # a per-key + per-IP rule of 100/minute on the IP. On a single server both limits are
    # one RL.ALL: at most 100 admitted.
    lim = async_limiter(server, prefix)
    app = starlette_app(lim, [Rule("/api/", API_AND_IP)])
    try:
        async with client(app) as c:
            got = [(await c.get("/api/thing", headers={"X-API-Key": f"k{i}"})).status_code for i in range(150)]
        assert got.count(200) == 100 and got.count(429) == 50
        assert lim.counters["redis_calls"] == 150  # one RL.ALL per request
        # A denied request left no charge: the per-key limits of the denied keys hold nothing.
        assert got.index(429) == 100
        for i in (100, 149):
            assert await lim.redis.exists(prefix + f"key:{{hdr.x-api-key:k{i}}}") == 0
    finally:
        await close(lim)


def test_rotating_api_keys_cannot_pass_the_per_ip_limit_wsgi(server: RedisServer, prefix: str) -> None:
    lim = Limiter(server.client(), prefix=prefix)
    app = flask.Flask("ids")

    @app.get("/api/thing")
    def api_thing() -> Any:
        return {"ok": True}

    app.wsgi_app = WsgiMiddleware(app.wsgi_app, lim, [Rule("/api/", API_AND_IP)])  # type: ignore[method-assign]
    c = app.test_client()
    got = [c.get("/api/thing", headers={"X-API-Key": f"k{i}"}).status_code for i in range(150)]
    assert got.count(200) == 100
    lim.close()


def test_keys_carry_the_identity_kind_and_nothing_else() -> None:
    rule = Rule("/api/", API_AND_IP)
    p = plan([rule], RequestInfo("GET", "/api/x", {"x-api-key": "secret-key"}, "198.51.100.7"))
    assert p is not None
    # The per-IP key holds the IP and the limit's name, never the API key.
    assert list(p.keys) == ["key:{hdr.x-api-key:secret-key}", "ip:{ip:198.51.100.7}"]
    # An API key equal to an IP address does not share that IP's bucket.
    by_key = plan([Rule("/", "5/minute", key=header("X-API-Key"))],
                  RequestInfo("GET", "/", {"x-api-key": "198.51.100.7"}, "203.0.113.1"))
    by_ip = plan([Rule("/", "5/minute", key=client_ip())], RequestInfo("GET", "/", {}, "198.51.100.7"))
    assert by_key is not None and by_ip is not None and set(by_key.keys).isdisjoint(by_ip.keys)
    assert custom_key(lambda i: "t1", kind="tenant")(RequestInfo("GET", "/", {}, None)) == Identity("tenant", "t1")
    with pytest.raises(ValueError):
        custom_key(lambda i: "x", kind="Bad Kind")
    # A rule's own hash tag puts all its keys in one slot.
    tagged = plan([Rule("/api/", API_AND_IP, hash_tag="api")],
                  RequestInfo("GET", "/api/x", {"x-api-key": "k"}, "198.51.100.7"))
    assert tagged is not None and list(tagged.keys) == ["{api}:key:hdr.x-api-key:k", "{api}:ip:ip:198.51.100.7"]


# -- a missing identity is never "no limit" ---------------------------------------------------


async def test_a_literal_value_never_collides_with_a_hashed_one(server: RedisServer, prefix: str) -> None:
    # The reviewer's collision: a value over 128 characters is hashed; the literal value
    # "sha256:<that hash>" gave the same key, so 10 requests with it exhausted the long
    # key's bucket. The hashed form starts with "~", which a literal value always has as
    # "%7E". The key bytes are the Rust crate's too.
    import hashlib

    long = "a" * 200
    digest = hashlib.sha256(long.encode()).hexdigest()
    lim = async_limiter(server, prefix)
    sync = Limiter(server.client(), prefix=prefix)
    rules = [Rule("/api/", Window(10, 60, "FIXED"), key=header("X-API-Key"), name="api")]
    flask_app = flask.Flask("hashed")
    flask_app.get("/api/thing")(lambda: {"ok": True})
    flask_app.wsgi_app = WsgiMiddleware(flask_app.wsgi_app, sync, rules)  # type: ignore[method-assign]
    wsgi = flask_app.test_client()
    try:
        async with client(starlette_app(lim, rules)) as c:
            for forged in (f"sha256:{digest}", f"~sha256:{digest}"):
                got = [(await c.get("/api/thing", headers={"X-API-Key": forged})).status_code for _ in range(5)]
                got += [wsgi.get("/api/thing", headers={"X-API-Key": forged}).status_code for _ in range(5)]
                assert got == [200] * 10
                assert (await c.get("/api/thing", headers={"X-API-Key": forged})).status_code == 429
            # The long key's bucket is untouched by either forgery, under both middlewares.
            r = await c.get("/api/thing", headers={"X-API-Key": long})
            assert r.status_code == 200 and '"api";r=9;' in r.headers["RateLimit"]
            assert wsgi.get("/api/thing", headers={"X-API-Key": long}).status_code == 200
        names = {k.decode() for k in await lim.redis.keys(prefix + "api:*")}
        assert names == {
            f"{prefix}api:{{hdr.x-api-key:~sha256:{digest}}}",    # the long key, hashed
            f"{prefix}api:{{hdr.x-api-key:sha256:{digest}}}",     # the literal forgeries
            f"{prefix}api:{{hdr.x-api-key:%7Esha256:{digest}}}",
        }
    finally:
        await close(lim)
        sync.close()


async def test_the_length_bound_counts_utf8_bytes(server: RedisServer, prefix: str) -> None:
    # 128 bytes of UTF-8 or fewer stay literal (escaped); more are hashed, as the Rust crate
    # counts them: 64 × "é" (128 bytes) is escaped, 65 × "é" (130) hashed. A header arrives
    # as latin-1 text, so the key holds the UTF-8 bytes of each latin-1 character.
    import hashlib

    lim = async_limiter(server, prefix)
    rules = [Rule("/api/", "5/minute", key=header("X-API-Key"), name="api")]
    try:
        async with client(starlette_app(lim, rules)) as c:
            for raw in (b"\xe9" * 64, b"\xe9" * 65, b"b" * 128, b"b" * 129):
                r = await c.get("/api/thing", headers=[(b"x-api-key", raw)])
                assert r.status_code == 200
        hashed = [raw.decode("latin-1") for raw in (b"\xe9" * 65, b"b" * 129)]
        names = {k.decode() for k in await lim.redis.keys(prefix + "api:*")}
        assert names == {
            f"{prefix}api:{{hdr.x-api-key:{'%C3%A9' * 64}}}",
            f"{prefix}api:{{hdr.x-api-key:{'b' * 128}}}",
            *(f"{prefix}api:{{hdr.x-api-key:~sha256:{hashlib.sha256(t.encode()).hexdigest()}}}" for t in hashed),
        }
    finally:
        await close(lim)


async def test_a_missing_api_key_is_limited_by_the_client_ip(server: RedisServer, prefix: str) -> None:
    # docs/clients.md#a-missing-identity-is-never-no-limit: header("X-API-Key") without a
    # default used to leave a request without the header unlimited (5 of 5 against 2).
    lim = async_limiter(server, prefix)
    app = starlette_app(lim, [Rule("/api/", Window(2, 60), key=header("X-API-Key"), name="api")])
    try:
        async with client(app, "198.51.100.1") as a, client(app, "198.51.100.2") as b:
            first = [(await a.get("/api/thing")).status_code for _ in range(5)]
            other_ip = (await b.get("/api/thing")).status_code
            with_key = (await a.get("/api/thing", headers={"X-API-Key": "k"})).status_code
        assert first == [200, 200, 429, 429, 429]
        assert other_ip == 200 and with_key == 200  # no shared "anonymous" bucket
        raw = lim.redis
        assert await raw.exists(prefix + "api:{ip:198.51.100.1}") == 1
    finally:
        await close(lim)


async def test_missing_deny_answers_401_and_skip_is_counted(server: RedisServer, prefix: str) -> None:
    lim = async_limiter(server, prefix)
    rules = [
        Rule("/api/", Window(2, 60), key=header("X-API-Key"), name="api", missing="deny"),
        Rule("/free", Window(1, 60), key=header("X-API-Key"), name="free", missing="skip"),
    ]
    app = starlette_app(lim, rules)
    try:
        async with client(app) as c:
            denied = await c.get("/api/thing")
            skipped = [(await c.get("/free")).status_code for _ in range(3)]
        assert denied.status_code == 401
        assert denied.json() == {"error": "identity_required", "policy": "api",
                                 "message": denied.json()["message"]}
        assert "RateLimit" not in denied.headers
        assert skipped == [200, 200, 200]
        snap = lim.counters.snapshot()
        assert snap["missing_denied"] == 1 and snap["skipped"] == 3 and snap["redis_calls"] == 0
    finally:
        await close(lim)


async def test_an_explicit_header_default_is_one_shared_bucket(server: RedisServer, prefix: str) -> None:
    lim = async_limiter(server, prefix)
    app = starlette_app(lim, [Rule("/api/", Window(2, 60), key=header("X-API-Key", "anonymous"), name="api")])
    try:
        async with client(app, "198.51.100.1") as a, client(app, "198.51.100.2") as b:
            got = [(await a.get("/api/thing")).status_code, (await b.get("/api/thing")).status_code,
                   (await a.get("/api/thing")).status_code]
        assert got == [200, 200, 429]  # keyless clients share it, as the rule asked
    finally:
        await close(lim)


# -- limits as users write them, and from a function of the request ---------------------------


async def test_limit_strings_and_limits_computed_per_request(server: RedisServer, prefix: str) -> None:
    lim = async_limiter(server, prefix)

    def by_plan(info: RequestInfo) -> str:
        return "1/minute" if info.headers.get("x-plan") == "free" else "3/minute"

    rules = [
        Rule("/api/", lambda info: Window(2, 10), key=header("X-API-Key"), name="fn"),
        Rule("/users/*", by_plan, key=header("X-API-Key"), name="plan"),
        Rule("/free", "2/minute; 3 per hour", key=header("X-API-Key"), name="multi"),
    ]
    app = starlette_app(lim, rules)
    try:
        async with client(app) as c:
            # A callable limit used to raise AttributeError ('function' object has no
            # attribute 'name').
            fn = [(await c.get("/api/thing", headers={"X-API-Key": "a"})).status_code for _ in range(3)]
            free = [(await c.get("/users/1", headers={"X-API-Key": "f", "X-Plan": "free"})).status_code
                    for _ in range(2)]
            pro = [(await c.get("/users/1", headers={"X-API-Key": "p"})).status_code for _ in range(4)]
            multi = [await c.get("/free", headers={"X-API-Key": "m"}) for _ in range(3)]
        assert fn == [200, 200, 429]
        assert free == [200, 429] and pro == [200, 200, 200, 429]
        assert [r.status_code for r in multi] == [200, 200, 429]
        # docs/clients.md#names: several limits in one string are <rule>-<window seconds>s.
        assert multi[0].headers["RateLimit-Policy"] == '"multi-60s";q=2;w=60, "multi-3600s";q=3;w=3600'
        assert multi[2].json()["policy"] == "multi-60s"
    finally:
        await close(lim)


def test_a_callable_limit_in_the_flask_decorator(server: RedisServer, prefix: str) -> None:
    from redis_rl.flask import rate_limit

    lim = Limiter(server.client(), prefix=prefix)
    app = flask.Flask("callable")

    @app.get("/r")
    @rate_limit(lim, lambda info: Window(1, 10), key=header("X-API-Key"))
    def r() -> Any:
        return {"ok": True}

    c = app.test_client()
    assert [c.get("/r", headers={"X-API-Key": "k"}).status_code for _ in range(2)] == [200, 429]
    lim.close()


def test_equal_windows_are_named_apart() -> None:
    p = plan([Rule("/", "1/minute; 2/minute; 3/minute", key=client_ip(), name="r")],
             RequestInfo("GET", "/", {}, "192.0.2.1"))
    assert p is not None and list(p.names.values()) == ["r-60s", "r-60s-2", "r-60s-3"]


# -- 413 for every cost that can never pass -------------------------------------------------


@pytest.mark.parametrize("cost", [6, 2**64 - 1, 2**64, 2**70])
async def test_every_cost_that_can_never_pass_is_413(server: RedisServer, prefix: str, cost: int) -> None:
    # A cost function returning 2^64 or more used to answer 500 (InvalidLimit).
    lim = async_limiter(server, prefix)
    app = starlette_app(lim, [
        Rule("/upload", GCRA(5, 1, 60), key=client_ip(), name="upload",
             cost=lambda info: int(info.headers["x-units"])),
        Rule("/api/", {"a": (GCRA(5, 1, 60), header("X-API-Key")), "b": (Window(9, 60), client_ip())},
             cost=lambda info: int(info.headers["x-units"])),
    ])
    try:
        async with client(app) as c:
            for path in ("/upload", "/api/thing"):
                r = await c.request("POST" if path == "/upload" else "GET", path,
                                    headers={"X-Units": str(cost), "X-API-Key": "k"})
                assert r.status_code == 413, (path, r.text)
                assert r.json()["error"] == "request_too_large" and "Retry-After" not in r.headers
    finally:
        await close(lim)


# -- exemptions, CORS preflights, client IP and routes (decided details) -------------------------


async def test_exempt_when_makes_no_redis_call(server: RedisServer, prefix: str) -> None:
    lim = async_limiter(server, prefix)
    rules = [Rule("/api/", Window(1, 60), key=client_ip(), name="api",
                  exempt_when=lambda info: info.headers.get("x-internal") == "yes")]
    app = starlette_app(lim, rules, exempt_when=lambda info: info.path == "/api/x")
    try:
        async with client(app) as c:
            internal = [await c.get("/api/thing", headers={"X-Internal": "yes"}) for _ in range(3)]
            by_middleware = [await c.get("/api/x") for _ in range(3)]
        assert all(r.status_code == 200 and "RateLimit" not in r.headers for r in internal + by_middleware)
        assert lim.counters["redis_calls"] == 0
    finally:
        await close(lim)


async def test_cors_preflights_are_exempt_unless_turned_off(server: RedisServer, prefix: str) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    for flag, expect in ((True, [200, 200, 200]), (False, [200, 429, 429])):
        lim = async_limiter(server, prefix + str(flag))

        async def anything(request: Request) -> Response:
            return Response("ok")

        app = AsgiMiddleware(Starlette(routes=[Route("/api/thing", anything, methods=["OPTIONS", "GET"])]), lim,
                             [Rule("/api/", Window(1, 60), key=client_ip(), name="api")], exempt_preflight=flag)
        try:
            async with client(app) as c:
                got = [(await c.options("/api/thing", headers=preflight)).status_code for _ in range(3)]
            assert got == expect
        finally:
            await close(lim)


def test_client_ip_decided_details() -> None:
    key = client_ip(["10.0.0.0/8"])
    info = lambda peer, **h: RequestInfo("GET", "/", {k.replace("_", "-"): v for k, v in h.items()}, peer)  # noqa: E731
    # IPv6 clients are keyed by their /64: rotating inside it gains nothing.
    a, b = key(info("2001:db8:1:2::1")), key(info("2001:db8:1:2:ffff::9"))
    assert a == b == Identity("ip", "2001:db8:1:2::/64")
    assert client_ip(ipv6_prefix=48)(info("2001:db8:1:2::1")) == Identity("ip", "2001:db8:1::/48")
    with pytest.raises(ValueError):
        client_ip(ipv6_prefix=32)
    # An unusable forwarding value falls back to the peer, and says so (counted).
    for bad in ("garbage", ":8080", ", ,", "unknown"):
        got = key(info("10.0.0.5", x_forwarded_for=bad))
        assert got == Identity("ip", "10.0.0.5", unusable_forwarding=True), bad
    fwd = client_ip(["10.0.0.0/8"], header="Forwarded")
    assert fwd(info("10.0.0.5", forwarded="for=_hidden")) == Identity("ip", "10.0.0.5", unusable_forwarding=True)
    # Repeated header lines are one list (joined by the adapters): the rightmost untrusted.
    assert key(info("10.0.0.5", x_forwarded_for="6.6.6.6, 198.51.100.7, 10.0.0.9")) == Identity("ip", "198.51.100.7")
    # No usable client address (no peer, a Unix socket, a peer that is not an IP address):
    # the one shared value "unknown", never None (no limit) and never the string itself.
    unknown = Identity("ip", "unknown", peer_unknown=True)
    for peer in (None, "", "x1", "/run/app.sock", "unknown"):
        assert key(info(peer)) == unknown, peer
        assert key(info(peer, x_forwarded_for="198.51.100.7")) == unknown, peer  # not trusted
    # "unix" trusts such a peer as a proxy: its forwarding header is read.
    unix = client_ip(["unix", "10.0.0.0/8"])
    assert unix(info(None, x_forwarded_for="6.6.6.6, 198.51.100.7, 10.0.0.9")) == Identity("ip", "198.51.100.7")
    assert unix(info("", x_forwarded_for="198.51.100.8")) == Identity("ip", "198.51.100.8")
    assert unix(info(None)) == unknown
    assert unix(info(None, x_forwarded_for="garbage")) == Identity(
        "ip", "unknown", unusable_forwarding=True, peer_unknown=True)
    assert unix(info("203.0.113.4", x_forwarded_for="198.51.100.7")) == Identity("ip", "203.0.113.4")
    assert client_ip(["unix"], header="Forwarded")(info(None, forwarded='for="[2001:db8::7]"')) == Identity(
        "ip", "2001:db8::/64")


async def test_an_unusable_forwarding_header_is_counted(server: RedisServer, prefix: str) -> None:
    lim = async_limiter(server, prefix)
    app = starlette_app(lim, [Rule("/api/", Window(5, 60), key=client_ip(["127.0.0.1"]), name="api")])
    try:
        async with client(app) as c:
            r = await c.get("/api/thing", headers={"X-Forwarded-For": "not-an-address"})
        assert r.status_code == 200
        assert lim.counters["forwarded_unusable"] == 1
        assert await lim.redis.exists(prefix + "api:{ip:127.0.0.1}") == 1
    finally:
        await close(lim)


@pytest.mark.parametrize("value, client", [
    ('for="198.51.100.1', None),            # an unclosed quote: unusable (it read 198.51.100.1)
    ('for=198.51.100.1"', None),            # a stray quote
    ('for="', None),
    ('for="198.51.100."1"', None),
    ('for="198.51.100.1"', "198.51.100.1"),  # quoted as a whole: the address
    ('for="[2001:db8::1]:4711"', "2001:db8::/64"),
    ("for=198.51.100.2;proto=https", "198.51.100.2"),
])
async def test_a_forwarded_value_is_quoted_as_a_whole_or_unusable(
    server: RedisServer, prefix: str, value: str, client: str | None
) -> None:
    # docs/clients.md#client-ip: an unusable value falls back to the peer and is counted as
    # forwarded_unusable, under both middlewares.
    lim = async_limiter(server, prefix)
    sync = Limiter(server.client(), prefix=prefix)
    rules = [Rule("/api/", Window(5, 60), key=client_ip(["127.0.0.1"], header="Forwarded"), name="api")]
    flask_app = flask.Flask("fwd")
    flask_app.get("/api/thing")(lambda: {"ok": True})
    flask_app.wsgi_app = WsgiMiddleware(flask_app.wsgi_app, sync, rules)  # type: ignore[method-assign]
    try:
        async with client_of(starlette_app(lim, rules)) as c:
            r = await c.get("/api/thing", headers={"Forwarded": value})
        w = flask_app.test_client().get("/api/thing", headers={"Forwarded": value},
                                        environ_base={"REMOTE_ADDR": "127.0.0.1"})
        assert r.status_code == w.status_code == 200
        expected = client or "127.0.0.1"
        assert '"api";r=3;' in w.headers["RateLimit"]  # both requests in one bucket
        assert await lim.redis.exists(f"{prefix}api:{{ip:{expected}}}") == 1
        unusable = 0 if client else 1
        assert lim.counters["forwarded_unusable"] == sync.counters["forwarded_unusable"] == unusable
    finally:
        await close(lim)
        sync.close()


async def test_routes_key_on_the_template_and_paths_are_normalised(server: RedisServer, prefix: str) -> None:
    lim = async_limiter(server, prefix)
    rules = [
        Rule("/api/x", Window(2, 60), key=client_ip(), name="exact"),
        Rule("/users/", Window(2, 60), key=route(), name="per-route"),
        Rule("/", Window(2, 60), key=route(), name="default"),
    ]
    app = starlette_app(lim, rules)
    try:
        async with client(app) as c:
            # One route, two ids: one bucket ("GET /users/{id}").
            users = [(await c.get(p)).status_code for p in ("/users/1", "/users/2", "/users/3")]
            # Spellings of one path meet the same rule and bucket.
            spelled = [(await c.get(p)).status_code for p in ("/api/x", "/api//x/", "/api/x/")]
            # Requests that match no route share the default rule's one bucket.
            nowhere = [(await c.get(p)).status_code for p in ("/a", "/b", "/c")]
        assert users == [200, 200, 429]
        assert spelled == [200, 404, 429]  # Starlette does not route "/api//x/"; it counts all the same
        assert nowhere == [404, 404, 429]
        assert await lim.redis.exists(prefix + "per-route:{route:GET%20/users/%7Bid%7D}") == 1
    finally:
        await close(lim)


async def test_a_users_limit_with_the_user_key_and_missing_ip(server: RedisServer, prefix: str) -> None:
    lim = async_limiter(server, prefix)
    app = starlette_app(lim, [Rule("/api/", Window(1, 60), key=user(), name="u")],
                        user=lambda scope: dict(scope.get("headers") or []).get(b"x-user", b"").decode() or None)
    try:
        async with client(app) as c:
            got = [(await c.get("/api/thing", headers={"X-User": "u1"})).status_code,
                   (await c.get("/api/thing", headers={"X-User": "u2"})).status_code,
                   (await c.get("/api/thing")).status_code, (await c.get("/api/thing")).status_code]
        assert got == [200, 200, 200, 429]
        assert await lim.redis.exists(prefix + "u:{ip:127.0.0.1}") == 1
    finally:
        await close(lim)
