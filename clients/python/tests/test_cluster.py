"""check_all (and check, leases, COST, FORCE) on a three-master Redis Cluster through
redis-py's cluster clients, sync and asyncio, in both modes: hash-tagged keys land on several
masters, each call is one round trip to its slot's master (no COMMAND GETKEYS), the fallback
library is loaded on every master, and untagged multi-key calls are refused as cross-slot."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import GCRA, AsyncLimiter, Lease, Limiter, Mode, RateLimitExceeded, Window, tag
from redis_rl._protocol import library_code, library_version
from redis_rl.http import Rule, client_ip, header

from .conftest import RedisCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module", params=["module", "fallback"])
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, RedisCluster]]:
    c = RedisCluster(module=request.param == "module")
    yield str(request.param), c
    c.close()


def masters_of(cluster: RedisCluster, keys: list[str]) -> set[int]:
    c = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        return {c.get_node_from_key(k).port for k in keys}
    finally:
        c.close()


def test_check_all_on_three_masters(cluster: tuple[str, RedisCluster]) -> None:
    mode, cl = cluster
    client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = Limiter(client, prefix="c:")
    try:
        assert lim.mode is (Mode.MODULE if mode == "module" else Mode.FALLBACK)
        users = [f"user{i}" for i in range(12)]
        assert len(masters_of(cl, [tag(u) for u in users])) == 3  # every master serves some
        for u in users:
            limits = {tag(u, "api"): GCRA(3, 1, 60), tag(u, "ip"): Window(2, 60, "SLIDING")}
            got = [lim.check_all(limits).allowed for _ in range(3)]
            assert got == [True, True, False], u
            assert lim.check(tag(u, "api"), GCRA(3, 1, 60), cost=0).remaining == 1
        with pytest.raises(redis.exceptions.RedisClusterException, match="(?i)slot"):
            lim.check_all({"a-user": GCRA(1, 1, 1), "b-user": GCRA(1, 1, 1)})
    finally:
        lim.close()
        client.close()


async def test_async_check_all_on_three_masters(cluster: tuple[str, RedisCluster]) -> None:
    mode, cl = cluster
    client = aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = AsyncLimiter(client, prefix="ac:")
    try:
        for i in range(6):
            limits = {tag(f"u{i}", "a"): GCRA(2, 1, 60), tag(f"u{i}", "b"): Window(5, 60, "FIXED")}
            got = [(await lim.check_all(limits)).allowed for _ in range(3)]
            assert got == [True, True, False]
        assert await lim.resolved_mode() is (Mode.MODULE if mode == "module" else Mode.FALLBACK)
    finally:
        await lim.aclose()
        await client.aclose()


def command_calls(cl: RedisCluster) -> dict[int, dict[str, int]]:
    """command_calls is each node's `INFO commandstats` calls, by port."""
    out = {}
    for n in cl.nodes:
        c = n.client()
        out[n.port] = {k.removeprefix("cmdstat_").lower(): v["calls"] for k, v in c.info("commandstats").items()}
        c.close()
    return out


def reset_stats(cl: RedisCluster) -> None:
    for n in cl.nodes:
        c = n.client()
        c.config_resetstat()
        c.close()


def test_each_call_is_one_round_trip_to_its_slots_master(cluster: tuple[str, RedisCluster]) -> None:
    # redis-py would ask COMMAND GETKEYS before every FCALL / RL.ALL / RL.GCRA (their keys are
    # movable); the limiter routes by its own keys instead.
    mode, cl = cluster
    client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = Limiter(client, prefix="rt:")
    try:
        lim.check("warm", GCRA(5, 1, 1))
        reset_stats(cl)
        users = [f"user{i}" for i in range(30)]
        for u in users:
            lim.check(tag(u, "api"), GCRA(5, 1, 1))
            lim.check_all({tag(u, "api"): GCRA(5, 1, 1), tag(u, "ip"): Window(5, 60)})
        calls = command_calls(cl)
        assert sum(c.get("command|getkeys", 0) for c in calls.values()) == 0
        name = ("rl.gcra", "rl.all") if mode == "module" else ("fcall", "fcall")
        per_master = {port: c.get(name[0], 0) + (c.get(name[1], 0) if name[0] != name[1] else 0)
                      for port, c in calls.items()}
        assert sum(per_master.values()) == 60
        expect = {}
        for u in users:
            port = client.get_node_from_key(tag(u)).port
            expect[port] = expect.get(port, 0) + 2
        assert per_master == {p: expect.get(p, 0) for p in per_master}
    finally:
        lim.close()
        client.close()


async def test_async_calls_need_no_getkeys(cluster: tuple[str, RedisCluster]) -> None:
    _, cl = cluster
    client = aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = AsyncLimiter(client, prefix="art:")
    try:
        await lim.check("warm", GCRA(5, 1, 1))
        reset_stats(cl)
        for i in range(20):
            await lim.check_all({tag(f"u{i}", "a"): GCRA(5, 1, 1), tag(f"u{i}", "b"): Window(5, 60)})
        assert sum(c.get("command|getkeys", 0) for c in command_calls(cl).values()) == 0
    finally:
        await lim.aclose()
        await client.aclose()


def library_versions(cl: RedisCluster) -> list[str | None]:
    out: list[str | None] = []
    for n in cl.nodes:
        c = n.client()
        try:
            v = c.execute_command("FCALL_RO", "rl_version", 0)
            out.append(v.decode())
        except redis.ResponseError:
            out.append(None)
        finally:
            c.close()
    return out


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_the_fallback_library_is_loaded_on_every_master(
    cluster: tuple[str, RedisCluster], flavor: str
) -> None:
    mode, cl = cluster
    if mode == "module":
        return  # nothing to load: the module answers
    ours = library_version(library_code())
    for n in cl.nodes:  # FUNCTION LOAD does not cross nodes: each master holds its own copy
        c = n.client()
        c.execute_command("FUNCTION", "FLUSH")
        c.close()
    assert library_versions(cl) == [None, None, None]
    users = [f"lib{i}" for i in range(12)]
    if flavor == "sync":
        client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
        lim = Limiter(client, prefix=f"lib-{flavor}:")
        assert lim.check(tag(users[0], "a"), GCRA(5, 1, 1)).allowed
        assert library_versions(cl) == [ours] * 3  # on every master, not only the first key's
        # One master loses it (a restart without persistence): the next call there reloads.
        lost = cl.nodes[1].client()
        lost.execute_command("FUNCTION", "DELETE", "redis_rl")
        lost.close()
        got = [lim.check(tag(u, "a"), GCRA(5, 1, 1)) for u in users]
        assert all(d.allowed and not d.degraded for d in got)
        assert library_versions(cl) == [ours] * 3
        lim.close()
        client.close()
    else:
        aclient = aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
        alim = AsyncLimiter(aclient, prefix=f"lib-{flavor}:", mode="fallback")
        assert (await alim.check(tag(users[0], "a"), GCRA(5, 1, 1))).allowed
        assert library_versions(cl) == [ours] * 3
        lost = cl.nodes[2].client()
        lost.execute_command("FUNCTION", "DELETE", "redis_rl")
        lost.close()
        got = [await alim.check(tag(u, "a"), GCRA(5, 1, 1)) for u in users]
        assert all(d.allowed and not d.degraded for d in got)
        assert library_versions(cl) == [ours] * 3
        await alim.aclose()
        await aclient.aclose()


async def test_usage_accounting_on_the_cluster(cluster: tuple[str, RedisCluster]) -> None:
    # COST, a LEASE spec and FORCE in one slot per user, on every master, and a lease held
    # with background renewal.
    _, cl = cluster
    client = aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = AsyncLimiter(client, prefix="ua:")
    try:
        for i in range(6):
            u = f"acct{i}"
            rpm, tpm, slots = Window(10, 60, "FIXED"), Window(2000, 60, "FIXED"), Lease(1, 5)
            limits = {tag(u, "rpm"): rpm, tag(u, "tpm"): (tpm, 1200), tag(u, "slots"): slots}
            d = await lim.check_all(limits, tokens={tag(u, "slots"): "w1"})
            assert d.allowed and d.per_key[lim.prefix + tag(u, "tpm")].remaining == 800
            # Binding: floor(0 / 1) lease slots ties floor(800 / 1200) tokens; the smaller
            # remaining (the lease's 0) wins.
            assert d.policy == slots and d.remaining == 0
            assert not (await lim.check_all(limits, tokens={tag(u, "slots"): "w2"})).allowed
            assert (await lim.release(tag(u, "slots"), "w1")).released == 1
            forced = await lim.check_all({tag(u, "rpm"): rpm, tag(u, "tpm"): (tpm, 5000)}, force=True)
            assert forced.allowed and forced.remaining == 0
            if i >= 2:
                continue  # the lease below takes a second: two users, on two masters or one
            async with lim.acquire(tag(u, "job"), Lease(1, "1.5")) as held:
                await asyncio.sleep(2.0)  # longer than the lease: renewed in the background
                assert not held.lost
                with pytest.raises(RateLimitExceeded):
                    async with lim.acquire(tag(u, "job"), Lease(1, "1.5")):
                        pass
    finally:
        await lim.aclose()
        await client.aclose()


# -- identities stay apart on a Cluster (docs/clients.md#identities-stay-apart) ----------------

PER_KEY_AND_IP = {
    # LOG, not an epoch-aligned window: an admitted request's key lives a whole minute after
    # it, whenever the test runs (a FIXED window's keys all expired at the minute's end when
    # the test ran across one: keys_exist saw none of them).
    "key": (Window(1000, 60, "LOG"), header("X-API-Key")),
    "ip": ("100/minute", client_ip()),
}


def keys_exist(cl: RedisCluster, keys: list[str]) -> list[bool]:
    c = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    try:
        return [bool(c.exists(k)) for k in keys]
    finally:
        c.close()


async def test_rotating_api_keys_are_held_to_the_per_ip_limit_on_a_cluster(
    cluster: tuple[str, RedisCluster],
) -> None:
    # The reproduction on three masters: each identity is its own hash tag, so a
    # request's two keys sit in different slots; they are checked in the rule's order and
    # what the per-key limit took is refunded when the per-IP limit denies.
    import httpx
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware

    mode, cl = cluster
    prefix = f"rot-{mode}:"

    async def thing(request: Request) -> Response:
        return JSONResponse({"ok": True})

    client = aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = AsyncLimiter(client, prefix=prefix)
    app = Starlette(routes=[Route("/api/thing", thing)], middleware=[
        Middleware(RateLimitMiddleware, limiter=lim, rules=[Rule("/api/", PER_KEY_AND_IP)])])
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            got = [(await c.get("/api/thing", headers={"X-API-Key": f"k{i}"})).status_code for i in range(150)]
        assert got.count(200) == 100 and got.index(429) == 100
        key_of = [f"{prefix}key:{{hdr.x-api-key:k{i}}}" for i in range(150)]
        assert len(masters_of(cl, key_of + [f"{prefix}ip:{{ip:127.0.0.1}}"])) == 3
        # No denied request left a charge: the per-key limit of every denied key is empty
        # (the first one refunded to nothing, the later ones denied from the deny cache
        # before anything was charged).
        assert keys_exist(cl, key_of[100:]) == [False] * 50
        assert keys_exist(cl, key_of[:100]) == [True] * 100
    finally:
        await lim.aclose()
        await client.aclose()


def test_a_denied_request_leaves_no_charge_on_any_key_of_a_cluster(cluster: tuple[str, RedisCluster]) -> None:
    # Sync, through the WSGI middleware: the per-key limit admits, the per-IP limit denies;
    # the per-key key's state (QUANTITY 0) is what it was before the request.
    import flask

    from redis_rl.wsgi import RateLimitMiddleware

    mode, cl = cluster
    prefix = f"nocharge-{mode}:"
    client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = Limiter(client, prefix=prefix, deny_cache=False)  # every request goes to Redis
    per_key = Window(10, 60, "FIXED")
    rules = [Rule("/api/", {"key": (per_key, header("X-API-Key")), "ip": (Window(2, 60, "FIXED"), client_ip())})]
    app = flask.Flask("cluster")

    @app.get("/api/thing")
    def api_thing() -> dict[str, bool]:
        return {"ok": True}

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, lim, rules)  # type: ignore[method-assign]
    web = app.test_client()
    try:
        assert [web.get("/api/thing", headers={"X-API-Key": "a"}).status_code for _ in range(2)] == [200, 200]
        before = lim.check("key:{hdr.x-api-key:a}", per_key, 0).remaining
        denied = web.get("/api/thing", headers={"X-API-Key": "a"})
        assert denied.status_code == 429 and denied.get_json()["policy"] == "ip"
        # Built as RL.ALL builds it: both limits in the fields, the binding one's numbers.
        assert denied.headers["RateLimit-Policy"] == '"key";q=10;w=60, "ip";q=2;w=60'
        assert lim.check("key:{hdr.x-api-key:a}", per_key, 0).remaining == before == 8
        fresh = web.get("/api/thing", headers={"X-API-Key": "b"})
        assert fresh.status_code == 429
        assert keys_exist(cl, [f"{prefix}key:{{hdr.x-api-key:b}}"]) == [False]
    finally:
        lim.close()
        client.close()


def test_a_rule_with_one_hash_tag_is_one_rl_all_on_a_cluster(cluster: tuple[str, RedisCluster]) -> None:
    from redis_rl.http import RequestInfo, decide, plan

    mode, cl = cluster
    client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = Limiter(client, prefix=f"tagged-{mode}:")
    try:
        lim.check("warm", GCRA(5, 1, 1))
        reset_stats(cl)
        rule = Rule("/api/", PER_KEY_AND_IP, hash_tag="demo")
        for i in range(5):
            p = plan([rule], RequestInfo("GET", "/api/x", {"x-api-key": f"k{i}"}, "192.0.2.1"))
            assert p is not None and decide(lim, p).allowed
        name = "rl.all" if mode == "module" else "fcall"
        assert sum(c.get(name, 0) for c in command_calls(cl).values()) == 5  # one call each
    finally:
        lim.close()
        client.close()
