"""The failure policy "local" (docs/clients.md#failure-policy-local): while Redis is
unreachable each process enforces the same limits in memory with the same algorithms (in
integer arithmetic, by the rules of docs/reference.md), optionally each limit divided by a
fleet size, with degraded decisions whose RateLimit numbers are the local limiter's own, and
goes back to Redis when it answers. Tested against a real redis-server stopped and started
again mid-run, and the in-memory algorithms against the module itself."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from redis_rl import GCRA, AsyncLimiter, Lease, Limiter, RateLimitExceeded, Source, Window
from redis_rl._memory import MemoryStore, _fixed_decide, _gcra_decide, _log_decide, _sliding_decide
from redis_rl.http import Rule, header

from .conftest import FrozenClock, RedisServer

DEADLINE = 20.0


@pytest.fixture
def own_server(mode: str) -> Iterator[RedisServer]:
    s = RedisServer(module=(mode == "module"))
    yield s
    s.close()


def make(flavor: str, server: RedisServer, **options: Any) -> Any:
    options.setdefault("probe_interval", 0.1)
    options.setdefault("on_error", "local")
    if flavor == "sync":
        return Limiter.from_url(server.url, timeout=0.3, **options)
    return AsyncLimiter.from_url(server.url, timeout=0.3, **options)


async def call(lim: Any, method: str, *a: Any, **kw: Any) -> Any:
    out = getattr(lim, method)(*a, **kw)
    return await out if hasattr(out, "__await__") else out


async def close(lim: Any) -> None:
    if isinstance(lim, AsyncLimiter):
        await lim.aclose()
        await lim.redis.aclose()
    else:
        lim.close()
        lim.redis.close()


async def until_redis_answers(lim: Any, key: str, limit: Any) -> Any:
    deadline = time.monotonic() + DEADLINE
    while True:
        d = await call(lim, "check", key, limit, 0)
        if not d.degraded:
            return d
        assert time.monotonic() < deadline, "Redis never answered again"
        await asyncio.sleep(0.05)


async def test_local_enforces_the_limits_while_redis_is_down_then_returns_to_redis(
    own_server: RedisServer, flavor: str, mode: str
) -> None:
    lim = make(flavor, own_server)
    g = GCRA(5, 1, 60)
    try:
        before = [await call(lim, "check", "k", g) for _ in range(2)]
        assert all(d.allowed and not d.degraded for d in before)
        assert before[0].source is (Source.MODULE if mode == "module" else Source.FALLBACK)
        own_server.stop()
        start = time.monotonic()
        during = [await call(lim, "check", "k", g) for _ in range(7)]
        took = time.monotonic() - start
        # The same algorithm, in memory (the local limiter starts empty: what Redis counted
        # before the outage is not known here).
        assert [d.allowed for d in during] == [True] * 5 + [False] * 2
        assert all(d.degraded and d.source is Source.LOCAL and not d.blind for d in during)
        assert [d.remaining for d in during[:5]] == [4, 3, 2, 1, 0]
        denied = during[5]
        # A wait of 60 s from the first local admission (less the time the calls took).
        assert 60 - took - 0.01 <= denied.retry_after.total_seconds() <= 60  # type: ignore[union-attr]
        h = denied.headers("api")
        assert h["RateLimit-Policy"] == '"api";q=5;w=300'
        assert h["RateLimit"].startswith('"api";r=0;t=')
        assert h["Retry-After"] == str(math.ceil(denied.retry_after.total_seconds()))  # type: ignore[union-attr]
        assert "RateLimit" in during[0].headers()  # real numbers, not a blind answer
        snap = lim.counters.snapshot()
        assert snap["local"] == 7 and snap["degraded"] == 7 and snap["denied"] == 2
        own_server.start()
        back = await until_redis_answers(lim, "k", g)
        # Back to Redis: it kept nothing across its restart, and decides again.
        assert back.source is (Source.MODULE if mode == "module" else Source.FALLBACK)
        assert (await call(lim, "check", "k", g)).remaining == 4
    finally:
        await close(lim)


async def test_local_with_a_fleet_size_divides_each_limit(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server, fleet_size=3)
    try:
        own_server.stop()
        # 10 per minute over 3 processes: 3 each (rounded down), at least 1.
        w = Window(10, 60, "FIXED")
        got = [await call(lim, "check", "w", w) for _ in range(4)]
        assert [d.allowed for d in got] == [True, True, True, False]
        assert got[0].limit == 3 and got[0].headers("w")["RateLimit-Policy"] == '"w";q=3;w=60'
        one = [await call(lim, "check", "tiny", Window(2, 60)) for _ in range(2)]
        assert [d.allowed for d in one] == [True, False]  # 2 // 3 is 0: at least 1
        g = await call(lim, "check", "g", GCRA(20, 10, 1))  # burst 6, rate 3 per second
        assert g.limit == 6 and g.remaining == 5
    finally:
        await close(lim)


async def test_local_check_all_refund_and_leases(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server)
    try:
        own_server.stop()
        limits = {"{u}:a": GCRA(2, 1, 60), "{u}:b": Window(5, 60)}
        got = [await call(lim, "check_all", limits) for _ in range(3)]
        assert [d.allowed for d in got] == [True, True, False]
        assert all(d.degraded and d.source is Source.LOCAL for d in got)
        # All or nothing: the denied call took nothing from "b" (its per-key answer is what
        # it alone would leave, as with PEEK).
        assert got[2].per_key[lim.prefix + "{u}:b"].remaining == 2
        assert (await call(lim, "check", "{u}:b", Window(5, 60), 0)).remaining == 3
        back = await call(lim, "refund", "{u}:a", 1)
        assert back.refunded == 1 and back.degraded
        assert (await call(lim, "check_all", limits)).allowed
        # A lease taken by the local policy holds its slot in memory, and gives it back.
        lease = Lease(1, 30)
        if flavor == "sync":
            with lim.acquire("job", lease) as held:
                assert held.decision.degraded and held.decision.source is Source.LOCAL
                with pytest.raises(RateLimitExceeded):
                    lim.acquire("job", lease)
            lim.acquire("job", lease).release()
        else:
            async with lim.acquire("job", lease) as aheld:
                assert aheld.decision.degraded and aheld.decision.source is Source.LOCAL
                with pytest.raises(RateLimitExceeded):
                    await lim.acquire("job", lease)
            await (await lim.acquire("job", lease)).release()
    finally:
        await close(lim)


async def test_middleware_answers_429_with_local_numbers_during_an_outage(own_server: RedisServer) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from redis_rl.asgi import RateLimitMiddleware

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    lim = make("async", own_server)
    app = RateLimitMiddleware(Starlette(routes=[Route("/", home)]), lim,
                              [Rule("/", "2/minute", key=header("X-API-Key"), name="api")])
    try:
        own_server.stop()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            got = [await c.get("/", headers={"X-API-Key": "k"}) for _ in range(3)]
        assert [r.status_code for r in got] == [200, 200, 429]
        assert got[0].headers["RateLimit"].startswith('"api";r=1;t=')
        assert got[2].headers["RateLimit"].startswith('"api";r=0;t=')
        assert got[2].json()["error"] == "rate_limited"
    finally:
        await close(lim)


def test_the_local_policy_is_refused_with_a_bad_fleet_size(module_server: RedisServer) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="fleet_size"):
            Limiter.from_url(module_server.url, on_error="local", fleet_size=bad)


# -- the in-memory algorithms against the module ----------------------------------------------


def module_reply(c: redis.Redis, op: str, key: str, limit: Any, n: int, peek: bool) -> list[int]:
    args: list[Any] = [key, *limit.args(), "QUANTITY", n]
    if peek:
        args.append("PEEK")
    return [int(x) for x in c.execute_command("RL.GCRA" if op == "gcra" else "RL.WINDOW", *args)]


@pytest.fixture(scope="module")
def frozen() -> Iterator[tuple[RedisServer, FrozenClock]]:
    """frozen is a server with the module whose clock the test sets (the clock shim)."""
    clock = FrozenClock()
    server = RedisServer(module=True, env=clock.env)
    try:
        probe = 1_700_000_000_123_456_000
        clock.freeze_at(probe)
        c = server.client()
        secs, us = (int(x) for x in c.time())
        c.close()
        assert secs * 1_000_000 + us == probe // 1000, "the clock shim does not govern this redis-server"
        yield server, clock
    finally:
        server.close()
        clock.close()


def test_memory_answers_as_the_module_does(frozen: tuple[RedisServer, FrozenClock]) -> None:
    # Random sequences (quantities, PEEK, parameter changes, refunds, time moving on by
    # microseconds to hours) on both sides at the same instants: the server's clock frozen
    # (the clock shim) and the memory store's clock reading the same instant. Every reply
    # is the same, every field exactly, however busy the host (it compared durations within
    # the time the last call took, which a slow earlier write on one side exceeded: 4 of 8
    # runs failed at load 14).
    server, clock = frozen
    c = server.client()
    now = time.time_ns() // 1000 * 1000  # the module reads microseconds
    store = MemoryStore(clock=lambda: now)
    rng = random.Random(23)
    groups: list[list[Any]] = [
        [GCRA(5, 1, 3600), GCRA(8, 2, 3600), GCRA(3, 1, 7200)],
        [Window(6, 3600, "FIXED"), Window(4, 3600, "FIXED")],
        [Window(6, 3600, "SLIDING"), Window(9, 3600, "SLIDING")],
        [Window(5, 3600, "LOG"), Window(3, 3600, "LOG")],
    ]
    steps_us = [0, 1, 999, 1_000, 250_000, 60_000_000, 450_000_000, 1_800_000_000, 3_600_000_000]
    try:
        for round_ in range(60):
            kind = rng.randrange(4)
            choices = groups[kind]
            key = f"diff{round_ % 6}:{kind}"
            for _ in range(12):
                now += rng.choice(steps_us) * 1000 if rng.random() < 0.4 else 0
                clock.freeze_at(now)
                lim = rng.choice(choices)
                n = rng.choice([0, 1, 1, 1, 2, 3, 7])
                peek = rng.random() < 0.2
                theirs = module_reply(c, "gcra" if isinstance(lim, GCRA) else "window", key, lim, n, peek)
                ours = store.check(key, lim, n, peek=peek)
                assert ours == theirs, (lim, n, peek, ours, theirs)
                if rng.random() < 0.15:
                    q = rng.randrange(1, 4)
                    theirs_r = [int(x) for x in c.execute_command("RL.REFUND", key, q)]
                    ours_r = store.refund(key, q)
                    assert ours_r == theirs_r, (lim, q, ours_r, theirs_r)
    finally:
        clock.freeze_at(time.time_ns())
        c.delete(*[k for k in c.scan_iter("diff*")] or ["-"])
        c.close()


def test_memory_check_all_and_leases_answer_as_the_module_does(module_server: RedisServer) -> None:
    c = module_server.client()
    store = MemoryStore()
    try:
        items = [("{m}:a", GCRA(3, 1, 3600), None, None), ("{m}:b", Window(2, 3600, "FIXED"), 1, None),
                 ("{m}:l", Lease(2, 3600), 1, b"tok")]
        for _ in range(4):
            theirs = c.execute_command(
                "RL.ALL", 3, "{m}:a", "{m}:b", "{m}:l", "GCRA", 3, 1, 3600, "WINDOW", 2, 3600, "FIXED",
                "COST", 1, "LEASE", 2, 3600, "tok", "COST", 1, "QUANTITY", 1,
            )
            ours = store.check_all(items, 1)
            assert [int(x) for x in theirs[0]][:3] == ours[0][:3]  # type: ignore[index]
            assert [[int(x) for x in r][:3] for r in theirs[1]] == [r[:3] for r in ours[1]]  # type: ignore[union-attr]
        for token in (b"t1", b"t2", b"t1", b"t3"):
            theirs_l = [int(x) for x in c.execute_command("RL.LEASE", "lk", 2, 3600, token)]
            assert store.lease("lk", Lease(2, 3600), token, 1)[:3] == theirs_l[:3]
        assert store.release("lk", b"t1")[:2] == [int(x) for x in c.execute_command("RL.RELEASE", "lk", "t1")][:2]
        with pytest.raises(redis.ResponseError, match="^LEASELOST lease 'gone' on key 'lk' is not held$"):
            store.lease("lk", Lease(2, 3600), b"gone", 1, renew=True)
    finally:
        c.delete("{m}:a", "{m}:b", "{m}:l", "lk")
        c.close()


S = 1_000_000_000


def test_retry_after_is_honest_for_every_algorithm() -> None:
    # docs/reference.md#r-reply-2: waiting exactly the reported time admits the same
    # request, 1 ns less does not (on the exact nanoseconds the store keeps).
    rng = random.Random(7)
    for _ in range(300):
        algo = rng.choice(["gcra", "fixed", "sliding", "log"])
        limit, window = rng.randrange(1, 6), rng.randrange(1, 5) * S
        burst, t = limit, rng.randrange(1, 3) * S // 3
        now = rng.randrange(10**18, 2 * 10**18)
        state: Any = None
        for _ in range(rng.randrange(1, 12)):
            n = rng.randrange(1, limit + 1)
            if algo == "gcra":
                d, w = _gcra_decide(burst, t, state, now, n, None)
            elif algo == "fixed":
                d, w = _fixed_decide(limit, window, state, now, n, False)
            elif algo == "sliding":
                d, w = _sliding_decide(limit, window, state, now, n, False)
            else:
                d, w = _log_decide(limit, window, state, now, n)
            if d.kind == "denied":
                def again(at: int) -> bool:
                    if algo == "gcra":
                        return _gcra_decide(burst, t, state, at, n, None)[0].allowed
                    if algo == "fixed":
                        return _fixed_decide(limit, window, state, at, n, False)[0].allowed
                    if algo == "sliding":
                        return _sliding_decide(limit, window, state, at, n, False)[0].allowed
                    return _log_decide(limit, window, state, at, n)[0].allowed
                assert again(now + d.wait), (algo, d)
                assert not again(now + d.wait - 1), (algo, d)
            elif w is not None:
                state = w
            now += rng.choice([0, 1, S // 10, S // 2, S, 3 * S])


def test_no_window_admits_more_than_its_limit() -> None:
    # FIXED: at most `limit` per aligned window; LOG: in any trailing window; GCRA: at most
    # burst + elapsed / T over any span (docs/reference.md#r-fixed-1, #r-log-1, #r-gcra-5).
    rng = random.Random(11)
    limit, window = 4, 2 * S
    now0 = 1_700_000_000 * S
    fixed: Any = None
    log: Any = None
    gcra: Any = None
    admitted: dict[str, list[int]] = {"fixed": [], "log": [], "gcra": []}
    now = now0
    for _ in range(2000):
        now += rng.randrange(0, S // 5)
        d, w = _fixed_decide(limit, window, fixed, now, 1, False)
        if d.allowed:
            fixed = w
            admitted["fixed"].append(now)
        d, w = _log_decide(limit, window, log, now, 1)
        if d.allowed:
            log = w
            admitted["log"].append(now)
        d, w = _gcra_decide(limit, window // limit, gcra, now, 1, None)
        if d.allowed:
            gcra = w
            admitted["gcra"].append(now)
    per_window: dict[int, int] = {}
    for t in admitted["fixed"]:
        per_window[t // window] = per_window.get(t // window, 0) + 1
    assert max(per_window.values()) <= limit
    log_times = admitted["log"]
    for i, t in enumerate(log_times):
        assert sum(1 for u in log_times[i:] if u < t + window) <= limit
    g = admitted["gcra"]
    for i in range(len(g)):
        for j in range(i, min(len(g), i + 40)):
            assert j - i + 1 <= limit + (g[j] - g[i]) // (window // limit)
