"""The failure policy "local"'s give-backs after Redis answers again
(docs/clients.md#failure-policy-local): a charge the in-memory limiter took during an outage
is given back there, not to Redis, which never had it (a refund Redis took for it would give
back another request's unit: the fleet would admit past the limit). Against a real
redis-server stopped and started again mid-test, as the Go package's local_refund_test.go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from redis_rl import GCRA, Decision, LimiterUnavailable, Lease, Limiter
from redis_rl.http import Rule, header

from .conftest import RedisServer
from .test_local_policy import call, close, make, until_redis_answers

PROBE = GCRA(4, 1, 3600)


@pytest.fixture
def own_server(mode: str) -> Iterator[RedisServer]:
    s = RedisServer(module=(mode == "module"))
    yield s
    s.close()


async def outage_then_back(lim: Any, server: RedisServer, during: Callable[[], Awaitable[None]]) -> None:
    """outage_then_back runs `during` with Redis stopped, then starts it again and waits
    (with a deadline) until Redis decides a check of a probe key again."""
    await until_redis_answers(lim, "probe", PROBE)
    server.stop()
    await during()
    server.start()
    await until_redis_answers(lim, "probe", PROBE)


def in_memory(lim: Any, key: str, limit: Any) -> int:
    """in_memory is what the in-memory limiter reports for key's remaining (a peek)."""
    return int(lim.memory.check(lim.prefix + key, limit, 0, peek=True)[2])


async def in_redis(lim: Any, key: str, limit: Any) -> Decision:
    d: Decision = await call(lim, "check", key, limit, 0)
    assert not d.degraded, d
    return d


async def test_local_refund_after_recovery_goes_back_to_memory(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server)
    g = GCRA(4, 1, 3600)  # nothing drains during the test
    try:
        async def during() -> None:
            for key, n in (("k", 2), ("split", 1)):
                d = await call(lim, "check", key, g, n)
                assert d.allowed and d.degraded and not d.blind, d

        await outage_then_back(lim, own_server, during)
        # Redis charges k once too: it holds 1 unit, memory 2.
        d = await call(lim, "check", "k", g)
        assert d.allowed and not d.degraded and d.remaining == 3
        # Refunding the outage's 2 units gives them back in memory; Redis keeps its own.
        r = await call(lim, "refund", "k", 2)
        assert (r.refunded, r.degraded) == (2, True), r
        assert (await in_redis(lim, "k", g)).remaining == 3, "Redis gave back a unit it did not take"
        assert in_memory(lim, "k", g) == 4, "memory kept the charge it took"
        # Nothing is owed in memory any more: the next refund is Redis's.
        r = await call(lim, "refund", "k", 2)
        assert (r.refunded, r.degraded, r.remaining) == (1, False, 4), r
        # More than memory owes: memory's part there, the rest to Redis.
        d = await call(lim, "check", "split", g, 2)
        assert d.allowed and not d.degraded
        r = await call(lim, "refund", "split", 3)
        assert (r.refunded, r.degraded) == (3, False), r
        assert (await in_redis(lim, "split", g)).remaining == 4
        assert in_memory(lim, "split", g) == 4
        assert lim.counters.snapshot()["refunded"] == 6  # 2 + 1 + 3
    finally:
        await close(lim)


async def test_local_owed_units_are_forgotten_when_the_key_is_idle(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server)
    quick = GCRA(2, 1, 1)  # idle again 1 s after a charge of 1
    try:
        async def during() -> None:
            assert (await call(lim, "check", "q", quick)).degraded

        await outage_then_back(lim, own_server, during)
        await asyncio.sleep(1.2)  # the key's state in memory has expired, its owed count too
        assert (await call(lim, "check", "q", quick)).remaining == 1  # Redis charges 1
        r = await call(lim, "refund", "q", 1)
        assert (r.refunded, r.degraded) == (1, False), r
        assert (await in_redis(lim, "q", quick)).remaining == 2
    finally:
        await close(lim)


async def test_local_refund_decision_goes_where_it_was_taken(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server)
    g = GCRA(4, 1, 3600)
    outage: list[Decision] = []
    try:
        async def during() -> None:
            outage.append(await call(lim, "check", "d", g, 2))

        await outage_then_back(lim, own_server, during)
        assert outage[0].allowed and outage[0].degraded and not outage[0].blind
        now = await call(lim, "check", "d", g)
        assert not now.degraded
        # Redis's decision: Redis gives back, memory keeps what it owes.
        r = await call(lim, "refund_decision", now, 1)
        assert (r.refunded, r.degraded, r.remaining) == (1, False, 4), r
        assert in_memory(lim, "d", g) == 2, "memory gave back a charge Redis took"
        # The outage's decision: memory gives back, after recovery; Redis is not asked.
        calls = lim.counters.snapshot()["redis_calls"]
        r = await call(lim, "refund_decision", outage[0], 2)
        assert (r.refunded, r.degraded) == (2, True), r
        assert lim.counters.snapshot()["redis_calls"] == calls, "a refund of memory's charge called Redis"
        assert in_memory(lim, "d", g) == 4
        # The per-key decisions of a check_all go back each where it was taken.
        both = await call(lim, "check_all", {"{u}:a": g, "{u}:b": g})
        r = await call(lim, "refund_decision", both.per_key[lim.prefix + "{u}:a"], 1)
        assert (r.refunded, r.degraded) == (1, False), r
        assert (await in_redis(lim, "{u}:a", g)).remaining == 4
        assert (await in_redis(lim, "{u}:b", g)).remaining == 3
        # Usage errors, as the Go package's RefundDecision returns them.
        with pytest.raises(ValueError, match="one key's decision"):
            await call(lim, "refund_decision", both, 1)  # a combined decision
        with pytest.raises(ValueError, match="one key's decision"):
            await call(lim, "refund_decision", Decision(True, 1, 1, now.retry_after, now.reset_after), 1)
        with pytest.raises(ValueError, match="quantity must be a positive integer"):
            await call(lim, "refund_decision", now, 0)
        with pytest.raises(TypeError, match="release"):
            if flavor == "sync":
                with lim.acquire("lease", Lease(2, 30)) as held:
                    lim.refund_decision(held.decision, 1)
            else:
                async with lim.acquire("lease", Lease(2, 30)) as aheld:
                    await lim.refund_decision(aheld.decision, 1)
        with pytest.raises(TypeError, match="takes a Decision"):
            await call(lim, "refund_decision", "d", 1)
    finally:
        await close(lim)


async def test_refund_decision_of_redis_is_lost_not_taken_from_memory_in_an_outage(
    own_server: RedisServer, flavor: str
) -> None:
    lim = make(flavor, own_server)
    g = GCRA(4, 1, 3600)
    try:
        redis_d = await call(lim, "check", "x", g)
        assert not redis_d.degraded
        own_server.stop()
        assert (await call(lim, "check", "x", g)).degraded  # memory charges 1 of its own
        r = await call(lim, "refund_decision", redis_d, 1)
        assert (r.refunded, r.degraded) == (0, True), r
        assert in_memory(lim, "x", g) == 3, "memory gave back a unit Redis took"
        # The open and closed policies charged nothing: nothing to give back (no call).
        blind = make(flavor, own_server, on_error="open")
        try:
            d = await call(blind, "check", "x", g)
            assert d.blind
            r = await call(blind, "refund_decision", d, 1)
            assert (r.refunded, r.degraded) == (0, True)
        finally:
            await close(blind)
        raising = make(flavor, own_server, on_error="raise")
        try:
            with pytest.raises(LimiterUnavailable):
                await call(raising, "refund_decision", redis_d, 1)
        finally:
            await close(raising)
    finally:
        await close(lim)


async def test_local_release_after_recovery_frees_the_lease_in_memory(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server)
    lease = Lease(1, 60)
    held: list[Any] = []
    try:
        async def during() -> None:
            held.append(await call(lim, "acquire", "job", lease))

        await outage_then_back(lim, own_server, during)
        h = held[0]
        assert h.decision.degraded and not h.decision.blind
        r = await call(lim, "release", "job", h.token)
        assert (r.released, r.degraded) == (1, False), r
        # Memory no longer holds the slot: another token takes it (a peek, in memory).
        assert lim.memory.lease(lim.prefix + "job", lease, b"another", 1, peek=True)[0] == 1
        await call(h, "release")  # the handle's own release: harmless after it
    finally:
        await close(lim)


# -- the middlewares, with deduct_when -------------------------------------------------------

LIMIT = GCRA(3, 1, 3600, name="api")  # nothing drains during the test


def _rule() -> Rule:
    return Rule("/", LIMIT, key=header("X-API-Key"), name="api", deduct_when=lambda status: status < 500)


def _short(lim: Any, d: Decision) -> str:
    assert d.key is not None
    return d.key[len(lim.prefix):]


async def _check_settled(lim: Any, d: Decision) -> None:
    """After a request admitted in memory during an outage whose handler, once Redis
    answered again, charged the same key in Redis (another request's unit) and answered 500:
    Redis still holds that unit, and memory gave the 500's unit back."""
    short = _short(lim, d)
    assert (await in_redis(lim, short, LIMIT)).remaining == 2, "Redis gave back a unit it never took"
    assert in_memory(lim, short, LIMIT) == 3, "memory kept the 500's charge"


async def test_asgi_deduct_when_after_recovery_refunds_in_memory(own_server: RedisServer) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware

    lim = make("async", own_server)
    seen: list[Decision] = []

    async def slow(request: Request) -> PlainTextResponse:
        d = request.state.rate_limit
        seen.append(d)
        assert d.allowed and d.degraded and not d.blind, d
        own_server.start()  # Redis answers again before the handler fails
        await until_redis_answers(lim, "probe", PROBE)
        # Another request's unit, charged in Redis (a restarted Redis kept nothing).
        assert not (await lim.check(_short(lim, d), LIMIT)).degraded
        return PlainTextResponse("boom", status_code=500)

    app = RateLimitMiddleware(Starlette(routes=[Route("/slow", slow)]), lim, [_rule()])
    try:
        await until_redis_answers(lim, "probe", PROBE)
        own_server.stop()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            assert (await c.get("/slow", headers={"X-API-Key": "k1"})).status_code == 500
        await _check_settled(lim, seen[0])
    finally:
        await close(lim)


async def test_wsgi_deduct_when_after_recovery_refunds_in_memory(own_server: RedisServer) -> None:
    from redis_rl.wsgi import DECISION_ENVIRON_KEY, RateLimitMiddleware

    lim = Limiter.from_url(own_server.url, timeout=0.3, probe_interval=0.1, on_error="local")
    seen: list[Decision] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        d = environ[DECISION_ENVIRON_KEY]
        seen.append(d)
        assert d.allowed and d.degraded and not d.blind, d
        own_server.start()
        deadline = time.monotonic() + 20
        while lim.check("probe", PROBE, 0).degraded:
            assert time.monotonic() < deadline, "Redis never answered again"
            time.sleep(0.05)
        assert not lim.check(_short(lim, d), LIMIT).degraded  # another request's unit, in Redis
        start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
        return [b"boom"]

    wrapped = RateLimitMiddleware(app, lim, [_rule()])
    try:
        assert not lim.check("probe", PROBE, 0).degraded
        own_server.stop()
        with httpx.Client(transport=httpx.WSGITransport(app=wrapped), base_url="http://t") as c:
            assert c.get("/slow", headers={"X-API-Key": "k1"}).status_code == 500
        await _check_settled(lim, seen[0])
    finally:
        await close(lim)


async def test_asgi_deduct_when_of_a_redis_decision_refunds_redis_on_a_key_memory_owes(
    own_server: RedisServer,
) -> None:
    # The key was charged in memory during an outage (a 200: the charge stays); after Redis
    # answers again, a request Redis admitted answers 500: its unit goes back to Redis, where
    # its decision took it, not to memory (which `refund(key)` would pick first).
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware

    lim = make("async", own_server)
    seen: list[Decision] = []

    async def home(request: Request) -> PlainTextResponse:
        seen.append(request.state.rate_limit)
        return PlainTextResponse("ok", status_code=int(request.headers.get("x-status", "200")))

    app = RateLimitMiddleware(Starlette(routes=[Route("/", home)]), lim, [_rule()])
    try:
        await until_redis_answers(lim, "probe", PROBE)
        own_server.stop()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            assert (await c.get("/", headers={"X-API-Key": "k1"})).status_code == 200
            own_server.start()
            await until_redis_answers(lim, "probe", PROBE)
            r = await c.get("/", headers={"X-API-Key": "k1", "x-status": "500"})
            assert r.status_code == 500
        assert seen[0].degraded and not seen[1].degraded, seen
        short = _short(lim, seen[1])
        assert (await in_redis(lim, short, LIMIT)).remaining == 3, "Redis kept the 500's unit"
        assert in_memory(lim, short, LIMIT) == 2, "memory gave back a unit Redis took"
    finally:
        await close(lim)


async def test_settle_gives_each_limit_back_where_its_own_decision_took_it(
    own_server: RedisServer, flavor: str
) -> None:
    # A combined decision with one limit decided by Redis and one in memory (what a Cluster
    # gives when one slot's master is down): each limit's charge goes back where it was taken.
    from redis_rl.http import Check, Plan, asettle, combine, settle

    lim = make(flavor, own_server)
    g = GCRA(4, 1, 3600)
    try:
        await until_redis_answers(lim, "probe", PROBE)
        own_server.stop()
        by_memory = await call(lim, "check", "b", g)
        own_server.start()  # empty: it kept nothing across its restart
        await until_redis_answers(lim, "probe", PROBE)
        by_redis = await call(lim, "check", "a", g)
        assert not by_redis.degraded and by_memory.degraded and not by_memory.blind
        assert (await call(lim, "check", "b", g)).remaining == 3  # Redis charges b once too
        d = combine([(by_redis, 1), (by_memory, 1)])
        assert d.allowed and d.degraded
        rule = Rule("/", g, key=header("X-API-Key"), deduct_when=lambda status: status < 500)
        plan = Plan(rule, (Check("a", g, "a", 1, "a"), Check("b", g, "b", 1, "b")), 1)
        if flavor == "sync":
            settle(lim, plan, d, 500, None)
        else:
            await asettle(lim, plan, d, 500, None)
        assert (await in_redis(lim, "a", g)).remaining == 4, "a's unit stayed in Redis"
        assert (await in_redis(lim, "b", g)).remaining == 3, "Redis gave back b's unit it did not take"
        assert in_memory(lim, "b", g) == 4, "memory kept b's unit"
    finally:
        await close(lim)
