"""Leases that know they are lost (docs/clients.md#leases-that-know-they-are-lost), in both
modes and both flavors: renewals are sent with RENEW, a renewal answered LEASELOST (or none
reaching Redis for a whole lease time) marks the handle lost, calls on_lost once, and makes
the block raise LeaseLost when it ends. The issue's lapse reproduction: Lease(1, 0.3), holder
A's renewals held up for about 0.9 s (a sync holder: its only pooled connection taken; an
asyncio holder: its event loop blocked), B acquires and releases meanwhile, then A's late
renewal arrives."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import AsyncLimiter, Lease, LeaseLost, Limiter, RateLimitExceeded

from .conftest import RedisServer

pytestmark = pytest.mark.asyncio

LAPSE = Lease(1, "0.3")
DEADLINE = 20.0  # seconds: bounds on waits, far beyond what any step needs


def wait_until(cond: Any, what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


async def await_until(cond: Any, what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def take_and_release(server: RedisServer, prefix: str, key: str, got: list[str]) -> None:
    """B: acquires the one slot as soon as A's lease has lapsed, then releases it."""
    lim = Limiter(server.client(), prefix=prefix)
    try:
        end = time.monotonic() + DEADLINE
        while True:
            try:
                held = lim.acquire(key, LAPSE, token="holder-b")
                break
            except RateLimitExceeded:
                assert time.monotonic() < end
                time.sleep(0.01)
        held.release()
        got.append("b took and released")
    finally:
        lim.close()
        lim.redis.close()


def holds(server: RedisServer, key: str) -> bool:
    c = server.client()
    try:
        return bool(c.exists(key))
    finally:
        c.close()


async def test_a_lapsed_lease_is_reported_lost_sync(server: RedisServer, prefix: str) -> None:
    # A's only connection is taken by the test, so its renewals wait for it ~0.9 s.
    pool = redis.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=1, timeout=DEADLINE)
    a = Limiter(redis.Redis(connection_pool=pool), prefix=prefix)
    lost_calls: list[Any] = []
    b_log: list[str] = []
    try:
        held = a.acquire("job", LAPSE, token="holder-a", on_lost=lost_calls.append)
        conn = pool.get_connection()
        started = time.monotonic()
        try:
            b = threading.Thread(target=take_and_release, args=(server, prefix, "job", b_log))
            b.start()
            b.join(DEADLINE)
            assert b_log == ["b took and released"]
            while time.monotonic() - started < 0.9:
                time.sleep(0.05)
            # No renewal reached Redis for a whole lease time: the handle says so already.
            assert held.lost
            assert lost_calls == [held]
        finally:
            pool.release(conn)
        # A's late renewal reaches Redis: RENEW answers LEASELOST, writes nothing, and the
        # renewals stop (it is not granted as a fresh acquire).
        wait_until(lambda: held._thread is not None and not held._thread.is_alive(), "the renewals to stop")
        assert not holds(server, prefix + "job")
        assert "no longer held" in held._lost_reason or "whole lease time" in held._lost_reason
        assert lost_calls == [held]  # once
        with pytest.raises(LeaseLost) as info:
            held.__exit__(None, None, None)
        assert info.value.key == prefix + "job" and info.value.token == b"holder-a"
        assert a.counters["leases_lost"] == 1
    finally:
        a.close()
        a.redis.close()


async def test_a_lapsed_lease_is_reported_lost_async(server: RedisServer, prefix: str) -> None:
    a = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
    lost_calls: list[Any] = []
    b_log: list[str] = []

    async def on_lost(h: Any) -> None:  # a coroutine hook runs as a task
        lost_calls.append(h)

    try:
        with pytest.raises(LeaseLost):
            async with a.acquire("job", LAPSE, token="holder-a", on_lost=on_lost) as held:
                b = threading.Thread(target=take_and_release, args=(server, prefix, "job", b_log))
                b.start()
                time.sleep(0.9)  # the event loop is blocked: no renewal can run
                b.join(DEADLINE)
                assert b_log == ["b took and released"]
                assert held._task is not None
                await await_until(held._task.done, "the late renewal")
                # RENEW answered LEASELOST: nothing written, renewals stopped.
                assert held.lost
                assert not holds(server, prefix + "job")
                await await_until(lambda: lost_calls == [held], "the on_lost task")
        assert a.counters["leases_lost"] == 1
    finally:
        await a.aclose()
        await a.redis.aclose()


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_renewal_answered_leaselost_when_the_lease_was_released_elsewhere(
    server: RedisServer, prefix: str, flavor: str
) -> None:
    # Another process released A's token (an operator, a bug): the next renewal learns it.
    lease = Lease(1, "1.5")  # renewed every 0.5 s
    got: list[Any] = []
    admin = Limiter(server.client(), prefix=prefix)
    try:
        if flavor == "sync":
            a = Limiter(server.client(), prefix=prefix)
            with pytest.raises(LeaseLost, match="no longer held"):
                with a.acquire("rel", lease, token="tok", on_lost=got.append) as held:
                    assert admin.release("rel", "tok").released == 1
                    wait_until(lambda: held._lost, "the renewal to answer LEASELOST")
            a.close()
            a.redis.close()
        else:
            aa = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
            with pytest.raises(LeaseLost, match="no longer held"):
                async with aa.acquire("rel", lease, token="tok", on_lost=got.append) as aheld:
                    assert admin.release("rel", "tok").released == 1
                    await await_until(lambda: aheld._lost, "the renewal to answer LEASELOST")
            await aa.aclose()
            await aa.redis.aclose()
        assert len(got) == 1
        assert not holds(server, prefix + "rel")  # RENEW did not take it again
    finally:
        admin.close()
        admin.redis.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_a_block_that_raised_is_not_masked_by_lease_lost(
    server: RedisServer, prefix: str, flavor: str
) -> None:
    lease = Lease(1, "1.5")
    admin = Limiter(server.client(), prefix=prefix)
    try:
        if flavor == "sync":
            a = Limiter(server.client(), prefix=prefix)
            with pytest.raises(KeyError):
                with a.acquire("raised", lease, token="t") as held:
                    admin.release("raised", "t")
                    wait_until(lambda: held._lost, "LEASELOST")
                    raise KeyError("the block's own error")
            a.close()
            a.redis.close()
        else:
            aa = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
            with pytest.raises(KeyError):
                async with aa.acquire("raised", lease, token="t") as aheld:
                    admin.release("raised", "t")
                    await await_until(lambda: aheld._lost, "LEASELOST")
                    raise KeyError("the block's own error")
            await aa.aclose()
            await aa.redis.aclose()
    finally:
        admin.close()
        admin.redis.close()


async def test_a_lease_renewed_in_time_is_not_lost(limiter: Any) -> None:
    # Lease 1.5 s, renewed every 0.5 s, held 2 s: RENEW is granted every time. (A lease that
    # short is only lost if no renewal reaches Redis for 1.5 s.)
    lease = Lease(1, "1.5")
    async with limiter.acquire("kept", lease) as held:
        await asyncio.sleep(2.0)
        assert not held.lost
    assert limiter.counters["leases_lost"] == 0


# -- an acquire cancelled while RL.LEASE is in flight -----------------------------------------


def hold_back_lease_replies(lim: AsyncLimiter) -> tuple[asyncio.Event, asyncio.Event]:
    """hold_back_lease_replies lets lim's next lease call reach Redis and be answered, then
    holds its reply back until the returned gate is set: the caller can be cancelled while
    the slot is already taken. Returns (granted, gate)."""
    orig = lim._guarded
    granted, gate = asyncio.Event(), asyncio.Event()

    async def held_back(op: str, keys: Any, args: Any) -> Any:
        got = await orig(op, keys, args)
        if op == "lease" and not granted.is_set():
            granted.set()
            await gate.wait()
        return got

    lim._guarded = held_back  # type: ignore[method-assign]
    return granted, gate


async def cancel_in_flight(lim: AsyncLimiter, key: str, lease: Lease, token: str | None = None) -> None:
    granted, gate = hold_back_lease_replies(lim)

    async def take() -> Any:
        return await lim.acquire(key, lease, token)

    task = asyncio.ensure_future(take())
    await asyncio.wait_for(granted.wait(), DEADLINE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()


async def test_an_acquire_cancelled_in_flight_releases_the_slot_it_took(server: RedisServer, prefix: str) -> None:
    lim = AsyncLimiter(aredis.Redis(port=server.port), prefix=prefix)
    other = AsyncLimiter(aredis.Redis(port=server.port), prefix=prefix)
    lease = Lease(1, 3600)  # held for the whole test unless released
    try:
        await cancel_in_flight(lim, "jobs", lease)
        # The slot comes free as soon as the held-back reply arrives (in the background).
        end = time.monotonic() + 10
        while True:
            try:
                held = await other.acquire("jobs", lease)
                break
            except RateLimitExceeded:
                assert time.monotonic() < end, "the cancelled acquire's slot is still held after 10 s"
                await asyncio.sleep(0.01)
        await held.release()
    finally:
        await lim.redis.aclose()
        await other.redis.aclose()


async def test_an_acquire_cancelled_in_flight_leaves_a_callers_token_to_the_caller(
    server: RedisServer, prefix: str
) -> None:
    lim = AsyncLimiter(aredis.Redis(port=server.port), prefix=prefix)
    lease = Lease(1, 3600)
    try:
        held = await lim.acquire("jobs", lease, "job-7")
        # A cancelled re-acquire under the same token (a renewal) must not free the lease.
        await cancel_in_flight(lim, "jobs", lease, "job-7")
        await asyncio.sleep(0.05)  # time for a background release, were there one
        assert (await held.renew()) is not None and not held.lost
        assert (await lim.release("jobs", "job-7")).released == 1
    finally:
        await lim.redis.aclose()
