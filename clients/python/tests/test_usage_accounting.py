"""Leases (acquire/release, background renewal), FORCE and per-limit COST, per the rules of
docs/reference.md (docs/reference.md#r-lease-1, docs/reference.md#r-force-1,
docs/reference.md#r-cost-1 and those after them), in both modes and both flavors."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import GCRA, AsyncLimiter, Lease, LeaseLost, Limiter, RateLimitExceeded, Source, Window

from .conftest import RedisServer, SyncAsAsync, close_limiter


async def test_acquire_holds_a_slot_and_releases_it_on_exit(limiter: Any) -> None:
    lease = Lease(2, 10)
    start = time.monotonic()
    async with limiter.acquire("jobs", lease) as a:
        assert a.decision.allowed and a.decision.remaining == 1
        async with limiter.acquire("jobs", lease) as b:
            assert b.decision.remaining == 0
            with pytest.raises(RateLimitExceeded) as info:
                async with limiter.acquire("jobs", lease):
                    pass
            d = info.value.decision
            assert not d.allowed and not d.never
            took = time.monotonic() - start
            assert 10 - took - 0.001 <= d.retry_after.total_seconds() <= 10
    async with limiter.acquire("jobs", lease, slots=2) as both:
        assert both.decision.remaining == 0


async def test_acquire_renews_in_the_background(limiter: Any) -> None:
    # Renewed every 0.5 s: a renewal may be a second late on a loaded host and still be in
    # time.
    lease = Lease(1, "1.5")
    async with limiter.acquire("long", lease) as held:
        await asyncio.sleep(3.2)  # over two lease times: held only through renewals
        with pytest.raises(RateLimitExceeded):
            async with limiter.acquire("long", lease):
                pass
        assert not held.lost
    async with limiter.acquire("long", lease):
        pass  # released on exit


async def test_a_crashed_holder_frees_its_slot_when_the_lease_ends(limiter: Any, r: redis.Redis) -> None:
    key = limiter.prefix + "crash"
    # A holder that took a lease and died (no renewal, no release).
    mode = await limiter.resolved_mode()
    args = [key, 1, "0.2", "dead-process"]
    r.execute_command("RL.LEASE", *args) if mode == "module" else r.execute_command(
        "FCALL", "rl_lease", 1, *args
    )
    with pytest.raises(RateLimitExceeded):
        async with limiter.acquire("crash", Lease(1, "0.2")):
            pass
    await asyncio.sleep(0.25)
    # Ours is long (the lease time is per call), so a slow host cannot make it lapse too.
    async with limiter.acquire("crash", Lease(1, 30)) as held:
        assert held.decision.allowed


async def test_acquire_with_the_same_token_renews_instead_of_taking_twice(limiter: Any) -> None:
    lease = Lease(2, 10)
    async with limiter.acquire("tok", lease, token="job-7") as a:
        async with limiter.acquire("tok", lease, token="job-7") as again:
            assert again.decision.remaining == 1  # still one lease of one slot
        assert a.token == b"job-7"
    released = await limiter.release("tok", "job-7")
    assert released.released == 0  # releasing twice is harmless


async def test_force_records_usage_past_the_limit(limiter: Any) -> None:
    g = GCRA(5, 1, 1)
    d = await limiter.force("f", g, 8)
    assert d.allowed and d.remaining == 0
    assert d.retry_after == timedelta(0)
    denied = await limiter.check("f", g)
    assert not denied.allowed  # until the excess has drained
    w = Window(10, 60, "FIXED")
    d = await limiter.force("fw", w, 25)
    assert d.allowed and d.remaining == 0


async def test_force_on_log_is_an_error(limiter: Any) -> None:
    with pytest.raises(redis.ResponseError):
        await limiter.force("fl", Window(10, 60, "LOG"), 1)


async def test_check_all_with_per_limit_costs(limiter: Any) -> None:
    # One request and 1,200 tokens: requests per minute and tokens per minute together.
    rpm, tpm = Window(600, 60, "FIXED", name="rpm"), Window(2000, 60, "FIXED", name="tpm")
    d = await limiter.check_all({"{t}:rpm": rpm, "{t}:tpm": (tpm, 1200)})
    assert d.allowed
    per = list(d.per_key.values())
    assert per[0].remaining == 599 and per[1].remaining == 800
    # The binding limit is tokens: 800 left admit no further call of 1,200.
    assert d.policy == tpm and d.remaining == 800
    denied = await limiter.check_all({"{t}:rpm": rpm, "{t}:tpm": (tpm, 1200)})
    assert not denied.allowed
    # A cost of 0 only reports.
    report = await limiter.check_all({"{t}:rpm": rpm, "{t}:tpm": (tpm, 0)})
    assert report.allowed


async def test_check_all_with_a_lease_spec(limiter: Any) -> None:
    limits = {"{j}:rate": GCRA(10, 1, 1), "{j}:slots": Lease(1, 10)}
    d = await limiter.check_all(limits, tokens={"{j}:slots": "w1"})
    assert d.allowed
    d2 = await limiter.check_all(limits, tokens={"{j}:slots": "w2"})
    assert not d2.allowed
    # Nothing was taken from the rate limit by the denied call.
    assert (await limiter.check("{j}:rate", GCRA(10, 1, 1), cost=0)).remaining == 9
    released = await limiter.release("{j}:slots", "w1")
    assert released.released == 1


async def test_a_released_slot_is_not_denied_locally(make_limiter: Any) -> None:
    # A lease's retry_after assumes nobody releases early, so it is no bound on when Redis
    # admits again: a denial by a full lease must not be repeated by the deny cache after the
    # holder (here another process) released its slot.
    a, b = make_limiter(), make_limiter()
    rate, slots = GCRA(100, 100, 1), Lease(1, 30)
    job = {"{j}:rate": rate, "{j}:slots": slots}
    assert (await a.check_all(job, tokens={"{j}:slots": "a"})).allowed
    denied = await b.check_all(job, tokens={"{j}:slots": "b"})
    assert not denied.allowed
    assert denied.retry_after > timedelta(seconds=20)
    assert (await a.release("{j}:slots", "a")).released == 1
    d = await b.check_all(job, tokens={"{j}:slots": "b"})
    assert d.allowed, d
    assert d.source is not Source.LOCAL
    assert b.counters["denied_locally"] == 0
    assert (await b.release("{j}:slots", "b")).released == 1


async def test_check_all_force(limiter: Any) -> None:
    limits = {"{u}:a": GCRA(2, 1, 60), "{u}:b": Window(2, 60, "FIXED")}
    d = await limiter.check_all(limits, cost=5, force=True)
    assert d.allowed and d.remaining == 0
    assert not (await limiter.check_all(limits)).allowed


async def test_check_all_binding_limit_is_a_charged_one(limiter: Any) -> None:
    # A COST 0 limit that happens to show the same limit and remaining as the charged one is
    # only reported: the combined decision names the charged limit.
    seen, charged = Window(10, 60, "FIXED", name="seen"), Window(10, 60, "FIXED", name="charged")
    await limiter.check("{b}:seen", seen)  # 9 left
    d = await limiter.check_all({"{b}:seen": (seen, 0), "{b}:charged": charged})
    assert [x.remaining for x in d.per_key.values()] == [9, 9]
    assert d.allowed and d.policy == charged and d.remaining == 9


async def test_check_all_lease_spec_with_cost_and_force_errors(limiter: Any) -> None:
    # A LEASE spec with COST n takes n slots; FORCE with a LEASE spec is refused and writes
    # nothing anywhere.
    limits = {"{c}:rate": GCRA(10, 1, 60), "{c}:slots": (Lease(3, 10), 2)}
    d = await limiter.check_all(limits, tokens={"{c}:slots": "w"})
    assert d.allowed
    assert d.per_key[limiter.prefix + "{c}:slots"].remaining == 1
    assert d.per_key[limiter.prefix + "{c}:rate"].remaining == 9
    with pytest.raises(redis.ResponseError, match="FORCE cannot be used on a LEASE limit"):
        await limiter.check_all(limits, tokens={"{c}:slots": "x"}, force=True)
    assert (await limiter.check("{c}:rate", GCRA(10, 1, 60), cost=0)).remaining == 9
    assert (await limiter.release("{c}:slots", "w")).released == 2


def test_release_while_a_renewal_is_in_flight(server: RedisServer, flavor: str, prefix: str) -> None:
    # Short leases (renewed every 10 ms) released at random moments, so releases land in the
    # middle of renewal calls. The renewal must stop without being cut off mid-command
    # (cancelling a redis-py command can swallow the cancellation and leak its connection:
    # the renewal then ran forever and release() never returned). The churn runs on its own
    # thread and event loop, so that a release that never returns fails this test instead
    # of hanging it.
    outcome: dict[str, Any] = {}

    async def churn() -> None:
        lim: Any
        if flavor == "sync":
            lim = SyncAsAsync(Limiter(server.client(), prefix=prefix))
        else:
            lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
        for i in range(40):
            try:
                async with lim.acquire(f"churn{i % 3}", Lease(1, "0.03")) as held:
                    assert held.decision.allowed
                    await asyncio.sleep(random.random() * 0.05)
            except LeaseLost:
                pass  # a 30 ms lease may lapse while held (and is then reported): fine here
        outcome["errors"] = lim.counters["errors"]
        for i in range(3):  # every lease was given back
            d = await lim.check_all({f"churn{i}": Lease(1, "0.03")}, tokens={f"churn{i}": "probe"}, peek=True)
            outcome.setdefault("free", []).append(d.allowed)
        await close_limiter(lim)

    def run() -> None:
        try:
            asyncio.run(churn())
        except BaseException as e:  # reported below
            outcome["raised"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "acquire/release churn did not finish in 30 s: a release hung"
    assert "raised" not in outcome, outcome
    assert outcome["errors"] == 0 and outcome["free"] == [True, True, True]
