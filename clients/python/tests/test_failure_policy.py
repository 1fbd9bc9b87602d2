"""The failure policy with a real redis-server stopped and started again in the middle of a
run, and paused (SIGSTOP) to make commands time out: open / closed / raise, one log line per
outage and one on recovery, counters, and recovery without help."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from redis_rl import GCRA, AsyncLimiter, Lease, LeaseLost, Limiter, LimiterUnavailable, Source, Window

from .conftest import RedisServer, expected_mode

pytestmark = pytest.mark.asyncio


@pytest.fixture
def own_server(mode: str) -> Iterator[RedisServer]:
    """own_server is a server this test may stop (module or not, per mode)."""
    s = RedisServer(module=(mode == "module"))
    yield s
    s.close()


def make(flavor: str, server: RedisServer, **options: Any) -> Any:
    options.setdefault("probe_interval", 0.1)
    if flavor == "sync":
        return Limiter.from_url(server.url, timeout=0.3, **options)
    return AsyncLimiter.from_url(server.url, timeout=0.3, **options)


async def call(lim: Any, method: str, *a: Any, **kw: Any) -> Any:
    result = getattr(lim, method)(*a, **kw)
    if hasattr(result, "__await__"):
        result = await result
    return result


async def close(lim: Any) -> None:
    if isinstance(lim, AsyncLimiter):
        await lim.aclose()
        await lim.redis.aclose()
    else:
        lim.close()
        lim.redis.close()


def outage_logs(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    down = sum("Redis unavailable" in r.getMessage() for r in caplog.records)
    up = sum("answers again" in r.getMessage() for r in caplog.records)
    return down, up


async def run_through_outage(
    lim: Any, server: RedisServer, limit: Any, key: str
) -> tuple[list[Any], list[Any], list[Any]]:
    """Checks before, during and after an outage: stop the server mid-run, keep checking,
    start it again, keep checking until Redis answers (bounded)."""
    before = [await call(lim, "check", key, limit) for _ in range(3)]
    server.stop()
    during = []
    for _ in range(30):
        during.append(await call(lim, "check", key, limit))
    server.start()
    after = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        d = await call(lim, "check", key, limit)
        after.append(d)
        if not d.degraded:
            break
        time.sleep(0.02)
    return before, during, after


async def test_open_admits_degraded_then_recovers(
    own_server: RedisServer, flavor: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="redis_rl")
    lim = make(flavor, own_server, on_error="open")
    g = GCRA(100, 100, 1)
    before, during, after = await run_through_outage(lim, own_server, g, "open")
    assert all(d.allowed and not d.degraded for d in before)
    assert before[0].source is (Source.MODULE if mode == "module" else Source.FALLBACK)
    assert all(d.allowed and d.degraded and d.source is Source.LOCAL for d in during)
    assert "RateLimit" not in during[0].headers()  # nothing is known about the key
    assert not after[-1].degraded and after[-1].allowed, after
    snap = lim.counters.snapshot()
    assert snap["degraded"] >= 30 and 1 <= snap["errors"] <= 30
    assert outage_logs(caplog) == (1, 1)  # once per burst of failures, once on recovery
    await close(lim)


async def test_closed_denies_with_a_short_retry_then_recovers(
    own_server: RedisServer, flavor: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="redis_rl")
    lim = make(flavor, own_server, on_error="closed", closed_retry_after=timedelta(seconds=2))
    w = Window(100, 60, "FIXED")
    before, during, after = await run_through_outage(lim, own_server, w, "closed")
    assert all(d.allowed for d in before)
    assert all(not d.allowed and d.degraded for d in during)
    assert during[0].retry_after == timedelta(seconds=2)
    assert during[0].headers()["Retry-After"] == "2"
    assert after[-1].allowed and not after[-1].degraded
    assert outage_logs(caplog) == (1, 1)
    await close(lim)


async def test_raise_raises_then_recovers(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server, on_error="raise")
    g = GCRA(10, 1, 1)
    assert (await call(lim, "check", "r", g)).allowed
    own_server.stop()
    with pytest.raises(LimiterUnavailable) as info:
        await call(lim, "check", "r", g)
    assert info.value.__cause__ is not None
    with pytest.raises(LimiterUnavailable):
        await call(lim, "refund", "r", 1)
    own_server.start()
    deadline = time.monotonic() + 5
    while True:
        try:
            d = await call(lim, "check", "r", g)
            break
        except LimiterUnavailable:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert d.allowed and not d.degraded
    await close(lim)


async def test_a_stalled_server_times_out_into_the_policy(own_server: RedisServer, flavor: str) -> None:
    lim = make(flavor, own_server, on_error="open", probe_interval=1.0)
    g = GCRA(10, 1, 1)
    assert not (await call(lim, "check", "t", g)).degraded
    own_server.pause()  # accepts connections, answers nothing
    try:
        start = time.monotonic()
        d = await call(lim, "check", "t", g)
        took = time.monotonic() - start
        assert d.degraded and d.allowed
        assert took < 10, took  # the 0.3 s timeout (a deadline with margin), not a hang
        assert lim.counters["errors"] == 1  # one call timed out…
        # …and inside the probe interval the policy answers at once: no Redis call at all.
        calls = lim.counters["redis_calls"]
        for _ in range(100):
            assert (await call(lim, "check", "t", g)).degraded
        assert lim.counters["redis_calls"] == calls and lim.counters["errors"] == 1
    finally:
        own_server.resume()
    deadline = time.monotonic() + 5
    while (await call(lim, "check", "t", g)).degraded:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    await close(lim)


async def test_server_restarted_empty_is_detected_again(own_server: RedisServer, flavor: str, mode: str) -> None:
    # A restart without persistence loses the Functions library: the fallback reloads it.
    lim = make(flavor, own_server, on_error="raise")
    g = GCRA(5, 1, 60)
    assert (await call(lim, "check", "e", g)).remaining == 4
    own_server.stop()
    own_server.start()
    deadline = time.monotonic() + 5
    while True:
        try:
            d = await call(lim, "check", "e", g)
            break
        except LimiterUnavailable:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert d.allowed and d.remaining == 4  # the state went with the restart
    mode_now = lim.mode if isinstance(lim, Limiter) else await lim.resolved_mode()
    assert mode_now is expected_mode(mode)
    await close(lim)


@pytest.mark.parametrize("policy", ["open", "closed", "raise"])
async def test_a_held_lease_outlived_by_an_outage_is_lost(
    own_server: RedisServer, flavor: str, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Renewals are not decisions: during an outage they neither raise (whatever the policy)
    # nor count as allowed/denied; a lease not renewed for a whole lease time is marked lost.
    # When Redis answers again (restarted empty: the lease went with the old process) the
    # next renewal, sent with RENEW, answers LEASELOST: renewals stop, nothing is taken
    # anew, and leaving the block raises LeaseLost (docs/clients.md#leases-that-know-they-are-lost).
    caplog.set_level(logging.WARNING, logger="redis_rl")
    lim = make(flavor, own_server, on_error=policy)
    lease = Lease(1, "1.5")  # renewed every 0.5 s
    failures: list[BaseException] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: failures.append(args.exc_value or RuntimeError("?"))
    try:
        cm = lim.acquire("job", lease)
        held = await cm.__aenter__() if flavor == "async" else cm.__enter__()
        assert held.decision.allowed and not held.decision.degraded
        await asyncio.sleep(0.7)  # a renewal keeps it
        own_server.stop()
        deadline = time.monotonic() + 20
        while not held.lost:  # no renewal reaches Redis for a whole lease time (1.5 s)
            assert time.monotonic() < deadline, "not marked lost"
            await asyncio.sleep(0.05)
        own_server.start()  # empty: the lease went with the old process
        while "no longer held" not in held._lost_reason:  # RENEW's LEASELOST
            assert time.monotonic() < deadline, "no renewal reached the restarted server"
            await asyncio.sleep(0.05)
        assert not await server_has_lease(own_server, "job")  # not taken anew
        with pytest.raises(LeaseLost):
            if flavor == "async":
                await cm.__aexit__(None, None, None)
            else:
                cm.__exit__(None, None, None)
        assert failures == []
        snap = lim.counters.snapshot()
        assert snap["allowed"] == 1 and snap["denied"] == 0 and snap["degraded"] == 0
        assert snap["errors"] >= 1 and snap["leases_lost"] == 1
        assert any("may be lost" in r.getMessage() for r in caplog.records)
    finally:
        threading.excepthook = old_hook
        await close(lim)


async def test_a_held_lease_rides_out_an_outage_shorter_than_the_lease(
    own_server: RedisServer, flavor: str
) -> None:
    # Redis paused for less than the lease: the renewals that time out are not decisions,
    # the next one after it answers again is granted (RENEW: the lease was never gone), and
    # the lease is not lost.
    lim = make(flavor, own_server, on_error="open")
    lease = Lease(1, "4.5")  # renewed every 1.5 s: the renewal after the pause has 1.2 s to spare
    try:
        cm = lim.acquire("ride", lease)
        held = await cm.__aenter__() if flavor == "async" else cm.__enter__()
        deadline = time.monotonic() + 20
        own_server.pause()
        while lim.counters["errors"] < 1:  # a renewal times out while Redis is paused
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        own_server.resume()
        calls = lim.counters["redis_calls"]
        while lim.counters["redis_calls"] < calls + 1:  # the next renewal, after the pause
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # its reply
        assert not held.lost and await server_has_lease(own_server, "ride")
        if flavor == "async":
            await cm.__aexit__(None, None, None)
        else:
            cm.__exit__(None, None, None)
        assert not await server_has_lease(own_server, "ride")  # released on exit
    finally:
        await close(lim)


async def server_has_lease(server: RedisServer, key: str) -> bool:
    c = server.client()
    try:
        return bool(c.exists(key))
    except redis.ConnectionError:
        return False
    finally:
        c.close()


async def test_the_first_probe_after_redis_returns_reaches_it(
    own_server: RedisServer, flavor: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Recovery costs no extra probe interval: the first call allowed to probe once Redis is
    # back (restarted on the same port) gets its answer from Redis, not one more degraded
    # answer and another interval of them.
    caplog.set_level(logging.WARNING, logger="redis_rl")
    lim = make(flavor, own_server, on_error="open")  # probe_interval 0.1 s
    g = GCRA(100, 100, 1)
    try:
        # Several connections in the pool (concurrent calls), all left stale by the stop.
        if isinstance(lim, AsyncLimiter):
            first = await asyncio.gather(*(lim.check("p", g) for _ in range(4)))
        else:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                first = list(pool.map(lambda _: lim.check("p", g), range(8)))
        assert not any(d.degraded for d in first)
        own_server.stop()
        assert (await call(lim, "check", "p", g)).degraded  # the outage starts
        await asyncio.sleep(0.15)  # past the probe interval
        assert (await call(lim, "check", "p", g)).degraded, "a probe while down"
        await asyncio.sleep(0.05)
        own_server.start()  # answers PING when this returns
        await asyncio.sleep(0.15)
        d = await call(lim, "check", "p", g)
        assert d.allowed and not d.degraded, d
        assert outage_logs(caplog) == (1, 1)
    finally:
        await close(lim)


async def test_the_first_call_after_a_restart_while_idle_is_decided_by_redis(
    own_server: RedisServer, flavor: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    # docs/clients.md#recovery: Redis restarts on the same port while the limiter is idle
    # (no call sees it down): the pooled connections the restart closed are replaced on the
    # spot. The async limiter answered the next calls from the failure policy (source LOCAL,
    # degraded, errors 1) until a probe interval had passed. Each kind of call, after its own
    # restart, with several stale connections in the pool.
    caplog.set_level(logging.WARNING, logger="redis_rl")
    # No probe would help (30 s), and a timeout far above what a busy host takes (2 s).
    kind: Any = Limiter if flavor == "sync" else AsyncLimiter
    lim = kind.from_url(own_server.url, timeout=2, on_error="open", probe_interval=30)
    g, w = GCRA(10, 1, 60), Window(10, 60, "FIXED")
    source = Source.MODULE if mode == "module" else Source.FALLBACK

    async def fill_the_pool() -> None:
        if isinstance(lim, AsyncLimiter):
            got = await asyncio.gather(*(lim.check("fill", g, 0) for _ in range(4)))
        else:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda _: lim.check("fill", g, 0), range(8)))
        assert not any(d.degraded for d in got)

    try:
        calls: list[tuple[str, Any]] = [
            ("check", lambda: call(lim, "check", "idle", g)),
            ("check_all", lambda: call(lim, "check_all", {"{i}a": g, "{i}b": w})),
            ("refund", lambda: call(lim, "refund", "idle", 1)),
            ("force", lambda: call(lim, "force", "idle", g, 2)),
        ]
        for what, make_call in calls:
            await fill_the_pool()
            own_server.stop()
            own_server.start()  # answers PING when this returns; the limiter saw nothing
            got = await make_call()
            assert not got.degraded, (what, got)
            if what != "refund":
                assert got.source is source and (got.allowed or what == "force"), (what, got)
        snap = lim.counters.snapshot()
        assert snap["errors"] == 0 and snap["degraded"] == 0, snap
        assert outage_logs(caplog) == (0, 0)
    finally:
        await close(lim)


async def test_a_refused_connect_is_not_tried_twice(flavor: str) -> None:
    # The retry on a fresh connection is for connections a restart closed: a refused connect
    # was a fresh one already (nothing listens), so it counts as the outage at once, one
    # attempt (with a client of redis-py's default retries, a second try doubled them).
    from .conftest import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens here
    kind: Any = Limiter if flavor == "sync" else AsyncLimiter
    lim = kind.from_url(url, timeout=0.3, on_error="open", mode="module")  # no detection: one call
    try:
        d = await call(lim, "check", "r", GCRA(5, 1, 1))
        assert d.degraded
        snap = lim.counters.snapshot()
        assert snap["redis_calls"] == 1 and snap["errors"] == 1, snap
    finally:
        await close(lim)


async def test_refund_and_release_inside_the_probe_interval_do_not_wait(
    own_server: RedisServer, flavor: str
) -> None:
    # Like a check, a refund or a release made while Redis is known to be down is answered
    # at once, not after a timeout each (a Held left mid-outage releases this way too).
    lim = make(flavor, own_server, on_error="open", probe_interval=5.0)
    g = GCRA(10, 1, 1)
    try:
        assert not (await call(lim, "check", "q", g)).degraded
        own_server.pause()  # accepts connections, answers nothing
        try:
            d = await call(lim, "check", "q", g)  # the 0.3 s timeout: the outage starts
            calls, errors = lim.counters["redis_calls"], lim.counters["errors"]
            refund = await call(lim, "refund", "q", 1)
            release = await call(lim, "release", "l", "token")
            # Answered without touching the network: no call made, none timed out.
            assert (lim.counters["redis_calls"], lim.counters["errors"]) == (calls, errors)
        finally:
            own_server.resume()
        assert d.degraded
        assert refund.degraded and release.degraded
    finally:
        await close(lim)
