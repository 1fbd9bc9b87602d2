"""The client per CLIENTS.md, against a real server, in both modes and both flavors
(sync Limiter, AsyncLimiter): decisions, check_all, refund, deny cache, batching."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import GCRA, NEVER, Algorithm, AsyncLimiter, Limiter, Source, Window
from redis_rl._limits import MAX_SECONDS

from .conftest import RedisServer, SyncAsAsync, close_limiter, expected_mode, fallback_call

pytestmark = pytest.mark.asyncio


def ms(d: Any) -> float:
    assert isinstance(d, timedelta), d
    return d.total_seconds() * 1000


async def test_auto_mode_picks_module_or_fallback(limiter: Any, mode: str) -> None:
    assert await limiter.resolved_mode() is expected_mode(mode)
    d = await limiter.check("k", GCRA(1, 1, 1))
    assert d.source is (Source.MODULE if mode == "module" else Source.FALLBACK)


async def test_auto_mode_works_for_a_user_denied_command_info(
    server: RedisServer, r: redis.Redis, flavor: str, mode: str, prefix: str
) -> None:
    # A user restricted to what a limiter needs (no COMMAND) gets NOPERM on COMMAND INFO:
    # mode="auto" must still find the module, or the fallback without it, and not fail
    # every call.
    name = f"limiter-{uuid.uuid4().hex[:8]}"
    r.execute_command("ACL", "SETUSER", name, "on", ">pw", "~*", "+@all", "-command")
    lim: Any = None
    try:
        with redis.Redis(port=server.port, username=name, password="pw") as c:
            with pytest.raises(redis.exceptions.NoPermissionError):
                c.execute_command("COMMAND", "INFO", "RL.GCRA")
        if flavor == "sync":
            lim = SyncAsAsync(
                Limiter(redis.Redis(port=server.port, username=name, password="pw"), prefix=prefix)
            )
        else:
            lim = AsyncLimiter(
                aredis.Redis(port=server.port, username=name, password="pw"), prefix=prefix
            )
        g = GCRA(1, 1, 1)
        d = await lim.check("k", g)
        assert d.allowed and d.source is (Source.MODULE if mode == "module" else Source.FALLBACK)
        assert await lim.resolved_mode() is expected_mode(mode)
        assert not (await lim.check("k", g)).allowed
    finally:
        r.execute_command("ACL", "DELUSER", name)
        if lim is not None:
            await close_limiter(lim)


async def test_idle_key_admits_exactly_burst_then_denies(limiter: Any) -> None:
    g = GCRA(3, 1, 10)
    start = time.monotonic()
    got = [await limiter.check("user", g) for _ in range(3)]
    assert [d.allowed for d in got] == [True, True, True]
    assert [d.remaining for d in got] == [2, 1, 0]
    assert all(d.limit == 3 and d.retry_after == timedelta(0) for d in got)
    denied = await limiter.check("user", g)
    # The waits shrink by the time the calls took (bounds on work, not on an idle machine).
    took_ms = (time.monotonic() - start) * 1000 + 1
    assert 30_000 - took_ms <= ms(got[2].reset_after) <= 30_000
    assert not denied.allowed and not denied.never and not denied.degraded
    assert 10_000 - took_ms <= ms(denied.retry_after) <= 10_000
    assert denied.headers()["Retry-After"] == str(math.ceil(ms(denied.retry_after) / 1000))


@pytest.mark.parametrize("algorithm", ["FIXED", "SLIDING", "LOG"])
async def test_window_allows_limit_then_denies(limiter: Any, algorithm: str) -> None:
    w = Window(2, 60, algorithm)
    assert w.algorithm is Algorithm(algorithm)
    got = [(await limiter.check("w", w)).allowed for _ in range(3)]
    assert got == [True, True, False]


async def test_cost_above_the_limit_is_never(limiter: Any) -> None:
    d = await limiter.check("big", GCRA(3, 1, 10), cost=4)
    assert not d.allowed and d.never and d.retry_after is NEVER
    assert d.retry_after_seconds is None
    assert "Retry-After" not in d.headers()
    # Asked again: still Redis's NEVER, not a cached retry.
    d2 = await limiter.check("big", GCRA(3, 1, 10), cost=4)
    assert d2.never


async def test_cost_zero_reports_without_taking(limiter: Any) -> None:
    g = GCRA(5, 1, 60)
    await limiter.check("c", g, cost=2)
    d = await limiter.check("c", g, cost=0)
    assert d.allowed and d.remaining == 3


async def test_peek_writes_nothing(limiter: Any, r: redis.Redis) -> None:
    g = GCRA(2, 1, 10)
    d = await limiter.check("p", g, peek=True)
    assert d.allowed and d.remaining == 1
    assert r.exists(limiter.prefix + "p") == 0
    assert (await limiter.check("p", g)).remaining == 1


async def test_max_wait_is_a_reservation(limiter: Any) -> None:
    g = GCRA(1, 1, 1)
    start = time.monotonic()
    assert (await limiter.check("m", g)).allowed
    d = await limiter.check("m", g, max_wait=timedelta(seconds=2))
    took_ms = (time.monotonic() - start) * 1000 + 1
    assert d.allowed and 1000 - took_ms <= ms(d.retry_after) <= 1000
    too_long = await limiter.check("m", g, max_wait=0.5)
    assert not too_long.allowed
    # Any wait at all: beyond the module's 2^64 − 1 ms, still a reservation (sent as that
    # most, not as a number the module refuses).
    for forever in (1e300, math.inf, 2**64):
        any_wait = await limiter.check("m", g, max_wait=forever)
        assert any_wait.allowed and ms(any_wait.retry_after) > 0, any_wait
    with pytest.raises(ValueError, match="max_wait"):
        await limiter.check("m", g, max_wait=math.nan)


@pytest.mark.parametrize(
    "setting",
    ["timeout", "batch_hold", "probe_interval", "closed_retry_after"],
)
@pytest.mark.parametrize(
    "value",
    [timedelta.max, math.inf, MAX_SECONDS + 1, 1e300, 0, -1, math.nan],
    ids=["timedelta.max", "inf", "ten-years-and-1s", "1e300", "zero", "negative", "nan"],
)
async def test_durations_beyond_ten_years_are_refused_when_built(
    module_server: RedisServer, flavor: str, setting: str, value: Any
) -> None:
    # Longer client-side timers used to be taken and then overflow mid-run (a thread's
    # wait, a socket timeout, timedelta(seconds=...)): refused when the limiter is built.
    options: dict[str, Any] = {setting: value}
    if setting == "batch_hold":
        options["batch"] = 5
    cls = Limiter if flavor == "sync" else AsyncLimiter
    with pytest.raises(ValueError, match=f"^{setting} must be a positive duration of at most"):
        cls.from_url(module_server.url, **options)
    if setting == "timeout" and flavor == "async":
        with pytest.raises(ValueError, match="^timeout must be"):
            AsyncLimiter(aredis.Redis(port=module_server.port), timeout=value)


async def test_the_longest_durations_work(server: RedisServer, flavor: str, prefix: str) -> None:
    longest: dict[str, Any] = dict.fromkeys(
        ["timeout", "batch_hold", "probe_interval", "closed_retry_after"], MAX_SECONDS
    )
    lim: Any
    if flavor == "sync":
        lim = SyncAsAsync(Limiter.from_url(server.url, batch=5, prefix=prefix, **longest))
    else:
        lim = AsyncLimiter.from_url(server.url, batch=5, prefix=prefix, **longest)
    try:
        g = GCRA(10, 1, 60)
        assert (await lim.check("long", g)).allowed  # a batched check starts the refunds
        assert (await lim.check("long", g)).allowed
        await asyncio.sleep(0.05)
        if isinstance(lim, SyncAsAsync):
            assert lim.inner._sweeper is not None and lim.inner._sweeper.is_alive()
        else:
            assert lim._sweeper is not None and not lim._sweeper.done()
    finally:
        await close_limiter(lim)


async def test_check_all_is_atomic_and_reports_each_key(limiter: Any, r: redis.Redis) -> None:
    api, ip = GCRA(2, 1, 60, name="api"), Window(1, 60, "FIXED", name="ip")
    limits = {"{c1}:api": api, "{c1}:ip": ip}
    first = await limiter.check_all(limits)
    assert first.allowed and len(first.per_key) == 2
    assert first.remaining == 0 and first.policy == ip  # the binding limit
    second = await limiter.check_all(limits)
    assert not second.allowed
    per = second.per_key
    assert per[limiter.prefix + "{c1}:api"].allowed  # api alone would admit…
    assert not per[limiter.prefix + "{c1}:ip"].allowed
    # …but nothing was taken from it.
    assert (await limiter.check("{c1}:api", api, peek=True)).remaining == 0
    assert (await limiter.check("{c1}:api", api, cost=0)).remaining == 1
    h = second.headers()
    assert h["RateLimit-Policy"] == '"api";q=2;w=120, "ip";q=1;w=60'
    assert h["RateLimit"].startswith('"api";r=0;t=') and ', "ip";r=0;t=' in h["RateLimit"]
    assert "Retry-After" in h


async def test_check_all_same_quantity_on_every_limit(limiter: Any) -> None:
    limits = {"{q}:a": GCRA(5, 1, 60), "{q}:b": Window(4, 60, "SLIDING")}
    d = await limiter.check_all(limits, cost=3)
    assert d.allowed and d.remaining == 1
    assert [x.remaining for x in d.per_key.values()] == [2, 1]


async def test_refund_gives_units_back(limiter: Any) -> None:
    g = GCRA(5, 1, 60)
    await limiter.check("job", g, cost=3)
    back = await limiter.refund("job", 1)
    assert back.refunded == 1 and back.remaining == 3 and not back.degraded
    missing = await limiter.refund("nothing-here", 2)
    assert (missing.refunded, missing.remaining, missing.reset_after) == (0, 0, timedelta(0))


async def test_wrongtype_is_raised_not_degraded(limiter: Any, r: redis.Redis) -> None:
    r.set(limiter.prefix + "str", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        await limiter.check("str", GCRA(1, 1, 1))
    assert limiter.counters["errors"] == 0


async def test_server_side_errors_are_raised(limiter: Any) -> None:
    # LOG limits above the server's rl.log-max-limit (100000) are refused by the server.
    with pytest.raises(redis.ResponseError, match="SLIDING"):
        await limiter.check("log", Window(200_000, 60, "LOG"))


async def test_prefix_is_part_of_the_key(limiter: Any, r: redis.Redis) -> None:
    await limiter.check("pk", GCRA(2, 1, 10))
    assert r.exists(limiter.prefix + "pk") == 1
    assert r.pttl(limiter.prefix + "pk") > 0


# -- deny cache -------------------------------------------------------------------------------


async def test_deny_cache_answers_locally_until_retry_after(limiter: Any) -> None:
    g = GCRA(1, 1, 1)  # one per second: 50 local answers take far less, even on a loaded host
    assert (await limiter.check("d", g)).allowed
    first = await limiter.check("d", g)
    assert not first.allowed and first.source is not Source.LOCAL
    calls = limiter.counters["redis_calls"]
    local = [await limiter.check("d", g) for _ in range(50)]
    assert all(not d.allowed and d.source is Source.LOCAL for d in local)
    assert limiter.counters["redis_calls"] == calls  # no round trip while denied
    assert limiter.counters["denied_locally"] == 50
    assert all(0 < ms(d.retry_after) <= ms(first.retry_after) for d in local)
    await asyncio.sleep(first.retry_after.total_seconds())  # type: ignore[union-attr]
    again = await limiter.check("d", g)
    assert again.allowed and again.source is not Source.LOCAL


async def test_deny_cache_never_denies_what_redis_would_admit(limiter: Any, r: redis.Redis) -> None:
    # While the cache denies a key, Redis denies it too: the cache's deadline counts from
    # when the denied request was *sent*, never later than Redis's. Checked with a PEEK on
    # the server right after each local denial that still had 20 ms or more to run.
    g = GCRA(2, 10, 1)  # 100 ms per request
    key = limiter.prefix + "x"
    deadline = time.monotonic() + 20  # a bound on work (20 checks), with a deadline
    checked = 0
    while checked < 20:
        assert time.monotonic() < deadline
        asked = time.monotonic()
        d = await limiter.check("x", g)
        if d.source is Source.LOCAL and ms(d.retry_after) >= 20:
            module = await limiter.resolved_mode() == "module"
            peek = r.execute_command("RL.GCRA", key, 2, 10, 1, "PEEK") if module \
                else fallback_call(r, "gcra", [key], 2, 10, 1, "PEEK")
            # Only a PEEK answered before the local denial ran out says anything (on a
            # loaded host the answer may come later; then it is not counted).
            if (time.monotonic() - asked) * 1000 < ms(d.retry_after) - 2:
                assert peek[0] == 0, (d, peek)
                checked += 1
        await asyncio.sleep(0.005)


async def test_deny_cache_lets_smaller_requests_ask_redis(limiter: Any) -> None:
    g = GCRA(3, 1, 60)
    await limiter.check("s", g, cost=2)
    denied = await limiter.check("s", g, cost=2)
    assert not denied.allowed
    small = await limiter.check("s", g, cost=1)
    assert small.allowed and small.source is not Source.LOCAL


async def test_refund_clears_local_denials(limiter: Any) -> None:
    g = GCRA(1, 1, 60)
    await limiter.check("rf", g)
    assert not (await limiter.check("rf", g)).allowed
    await limiter.refund("rf", 1)
    assert (await limiter.check("rf", g)).allowed


async def test_deny_cache_can_be_turned_off(make_limiter: Any) -> None:
    lim = make_limiter(deny_cache=False)
    g = GCRA(1, 1, 60)
    await lim.check("o", g)
    for _ in range(3):
        assert (await lim.check("o", g)).source is not Source.LOCAL
    assert lim.counters["redis_calls"] == 4


# -- batching ---------------------------------------------------------------------------------


async def test_batching_admits_locally_and_never_more_than_the_limit(make_limiter: Any, r: redis.Redis) -> None:
    lim = make_limiter(batch=5, batch_hold=0.2)
    g = GCRA(20, 20, 1)  # 20 at once, then one per 50 ms
    start = time.monotonic()
    admitted = 0
    for _ in range(400):
        if (await lim.check("b", g)).allowed:
            admitted += 1
    elapsed = time.monotonic() - start
    bound = 20 + int(elapsed * 20) + 1
    assert 20 <= admitted <= bound
    snap = lim.counters.snapshot()
    assert snap["allowed_locally"] > 0
    assert snap["redis_calls"] < admitted
    await lim.aclose()  # gives back what is still held


def remaining_in_redis(r: redis.Redis, mode: str, key: str, g: GCRA) -> int:
    """remaining_in_redis asks the server directly (QUANTITY 0), not through the limiter."""
    args = [key, *g.args(), "QUANTITY", 0]
    reply = r.execute_command("RL.GCRA", *args) if mode == "module" else \
        fallback_call(r, "gcra", [key], *args[1:])
    return int(reply[2])


async def test_batch_leftovers_are_refunded(make_limiter: Any, r: redis.Redis, mode: str) -> None:
    lim = make_limiter(batch=5, batch_hold=0.1)
    g = GCRA(50, 1, 60)
    d = await lim.check("lo", g)
    assert d.allowed and d.remaining == 49  # 45 left in Redis + 4 held here
    key = lim.prefix + "lo"
    # The hold (0.1 s) passes and the sweeper gives the 4 units back; bounded wait, with a
    # deadline far beyond the hold, so a loaded machine only makes it slower.
    deadline = time.monotonic() + 20
    while remaining_in_redis(r, mode, key, g) != 49:
        assert time.monotonic() < deadline, "the leftovers were not refunded"
        await asyncio.sleep(0.02)
    # Redis shows the refund: the counter shows it too (it never lags what Redis shows).
    assert lim.counters["refunded"] == 4


async def test_the_refunded_counter_never_lags_what_redis_shows(
    make_limiter: Any, r: redis.Redis, mode: str
) -> None:
    # Two credits, refunded one after the other by the background sweeper. At the moment the
    # second refund is sent, Redis already shows the first: the counter must show it too.
    # (It was bumped once, after every refund of a sweep had landed.) Checked from the hook
    # the limiter calls before each of its Redis calls, so the check runs exactly at those
    # moments, whatever the machine's load.
    g = GCRA(50, 1, 60)
    seen: list[tuple[int, int]] = []  # (units back in Redis, refunded counter)

    def hook(name: str, n: int) -> None:
        if name == "redis_calls":
            # A key holds 45 once charged (5 taken), 49 once its 4 leftovers are back; 50
            # (missing) before its check.
            left = [remaining_in_redis(r, mode, lim.prefix + k, g) for k in ("x", "y")]
            seen.append((sum(n - 45 for n in left if n <= 49), lim.counters["refunded"]))

    lim = make_limiter(batch=5, batch_hold=0.1, hook=hook)
    assert (await lim.check("x", g)).allowed and (await lim.check("y", g)).allowed
    deadline = time.monotonic() + 20
    while sum(remaining_in_redis(r, mode, lim.prefix + k, g) for k in ("x", "y")) != 98:
        assert time.monotonic() < deadline, "the sweeper did not refund"
        await asyncio.sleep(0.02)
    assert (4, 0) not in seen and any(back == 4 for back, _ in seen), seen
    assert all(counted >= back for back, counted in seen), seen
    assert lim.counters["refunded"] == 8


async def test_batching_near_the_limit_takes_what_is_left(make_limiter: Any) -> None:
    lim = make_limiter(batch=10, batch_hold=5)
    g = GCRA(12, 1, 3600)
    got = [(await lim.check("n", g)).allowed for _ in range(14)]
    assert got == [True] * 12 + [False, False]


async def test_batching_fixed_window_never_exceeds_any_window(make_limiter: Any, r: redis.Redis) -> None:
    # Two limiters (two "processes") batching on one FIXED window key: each window admits
    # at most its limit; units are never used or refunded across a window boundary.
    w = Window(15, 0.5, "FIXED")
    a, b = make_limiter(batch=4, batch_hold=1), make_limiter(batch=4, batch_hold=1)
    per_window: dict[int, int] = {}
    deadline = time.time() + 2.2
    while time.time() < deadline:
        for lim in (a, b):
            before = time.time()
            d = await lim.check("fw", w)
            after = time.time()
            if d.allowed:
                # The window the admission lands in (by this host's clock; the server runs
                # here too). Skip the rare admission that straddles a boundary.
                if int(before / 0.5) == int(after / 0.5):
                    per_window[int(before / 0.5)] = per_window.get(int(before / 0.5), 0) + 1
    assert per_window and max(per_window.values()) <= 15, per_window


async def test_concurrent_batches_admit_exactly_the_limit(make_limiter: Any) -> None:
    # Two limiters ("processes") x 8 threads or tasks batching one GCRA key (50 per hour,
    # batch 10) at once, then each limiter checked one at a time until it denies: exactly
    # 50 admitted. Those missing the credit together each take a batch: a concurrent batch
    # must merge into the live credit (not replace it, stranding its units until a
    # refund), and one's cached denial must not keep the others from units their limiter
    # already paid for (the credit answers before the deny cache).
    g = GCRA(50, 50, 3600)
    lims = [make_limiter(batch=10, batch_hold=600) for _ in range(2)]

    async def three(lim: Any) -> int:
        return sum([(await lim.check("cb", g)).allowed for _ in range(3)])

    if isinstance(lims[0], SyncAsAsync):
        barrier = threading.Barrier(16, timeout=30)

        def run(lim: Any) -> int:
            barrier.wait()
            return sum(lim.inner.check("cb", g).allowed for _ in range(3))

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(run, lim) for lim in lims for _ in range(8)]
            together = sum(f.result(timeout=30) for f in futures)
    else:
        together = sum(
            await asyncio.wait_for(asyncio.gather(*(three(lim) for lim in lims for _ in range(8))), 30)
        )
    drained = [0, 0]
    for i, lim in enumerate(lims):
        while (await lim.check("cb", g)).allowed:
            drained[i] += 1
            assert drained[i] <= 50, "more than the limit"
    assert together + sum(drained) == 50, (together, drained)
    for lim in lims:
        await close_limiter(lim)
    fresh = make_limiter()
    assert (await fresh.check("cb", g, cost=0)).remaining == 0, "nothing was held back to refund"


# -- out of memory ----------------------------------------------------------------------------


async def test_out_of_memory_refuses_writes_and_still_denies(
    make_limiter: Any, r: redis.Redis, server: RedisServer, mode: str
) -> None:
    """docs/clients.md#out-of-memory: right after CONFIG SET maxmemory 1 denials, peeks and cost 0
    are Redis's own answers, and the very next check that would write is refused (the server's
    OOM error, for the failure policy: here raise) and writes nothing, in both modes. As the
    fallback, the server refuses FCALL rl_* whole and the client asks its no-writes twin
    (FCALL_RO rl_*_ro) once. Also the twin by raw FCALL_RO. (An OOM error is an outage for
    the policy: inside its probe interval a limiter does not ask Redis, so each refused write
    here has a limiter of its own.)"""
    from redis_rl import Lease
    from redis_rl._policy import LimiterUnavailable, RateLimitExceeded

    from .conftest import SERVER_MAJOR, command_stats

    lim = make_limiter(on_error="raise", deny_cache=False)
    g, w = GCRA(1, 1, 3600), Window(5, 3600, "FIXED")
    assert (await lim.check("full", g)).allowed
    assert (await lim.check("win", w)).allowed
    async with lim.acquire("lease", Lease(1, 60), token="a"):
        # This test's own keys: the shared server's DBSIZE also moves as other tests' keys expire.
        def own_keys() -> list[bytes]:
            return sorted(r.scan_iter(match=lim.prefix + "*", count=1000))

        before = own_keys()
        twins = command_stats(server).get("fcall_ro", 0)
        r.config_set("maxmemory", 1)
        try:
            source = Source.MODULE if mode == "module" else Source.FALLBACK
            denied = await lim.check("full", g)
            assert not denied.allowed and not denied.degraded and denied.source is source
            peek = await lim.check("win", w, peek=True)
            assert peek.allowed and peek.remaining == 3 and not peek.degraded
            zero = await lim.check("new", g, cost=0)
            assert zero.allowed and zero.remaining == 1 and not zero.degraded
            both = await lim.check_all({"full": g, "x": w})
            assert not both.allowed and not both.degraded
            with pytest.raises(RateLimitExceeded):
                async with lim.acquire("lease", Lease(1, 60), token="b"):
                    pass
            for key, limit in (("win", w), ("new", g)):
                alone = make_limiter(on_error="raise", deny_cache=False, prefix=lim.prefix)
                with pytest.raises(LimiterUnavailable) as caught:
                    await alone.check(key, limit)
                assert str(caught.value.__cause__) == "command not allowed when used memory > 'maxmemory'."
            alone = make_limiter(on_error="raise", deny_cache=False, prefix=lim.prefix)
            with pytest.raises(LimiterUnavailable):
                await alone.check_all({"{a}x": g, "{a}y": w})
            assert own_keys() == before, "nothing written out of memory"
            if mode == "fallback" and SERVER_MAJOR >= 7:
                assert command_stats(server).get("fcall_ro", 0) >= twins + 8
                # The twin itself, by raw FCALL_RO: a denial answers, a write answers OOM.
                full = lim.prefix + "full"
                assert r.execute_command("FCALL_RO", "rl_gcra_ro", 1, full, 1, 1, 3600)[0] == 0
                with pytest.raises(redis.exceptions.OutOfMemoryError):
                    r.execute_command("FCALL_RO", "rl_gcra_ro", 1, lim.prefix + "new2", 1, 1, 3600)
                with pytest.raises(redis.exceptions.OutOfMemoryError):
                    fallback_call(r, "gcra", [full], 1, 1, 3600)
        finally:
            r.config_set("maxmemory", 0)
    d = await lim.check("win", w)
    assert d.allowed and d.remaining == 3
    assert (await lim.check("new", g)).allowed


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_out_of_memory_a_noperm_on_a_key_of_the_twin_is_the_servers_error(flavor: str, prefix: str) -> None:
    """docs/clients.md#out-of-memory: only FCALL_RO refused to this client (a NOPERM on the
    command) means "no twin", where the first OOM stands. A NOPERM on one of the twin's keys
    (the user's key patterns: here its one selector that allows FCALL_RO, on `<prefix>ok*`
    only) is the server's answer to the call, raised as it is, not an outage the failure
    policy (open) would admit. (It was taken for "no twin" before: the OOM stood, and the
    call was admitted, degraded.)"""
    from .conftest import SERVER_MAJOR

    if SERVER_MAJOR < 7:
        pytest.skip("no Functions library, so no twin, before Redis 7")
    s = RedisServer(module=False)
    admin = s.client()
    admin.execute_command(
        "ACL", "SETUSER", "twin", "on", ">pw", f"~{prefix}*", "+@all", "-fcall_ro", f"(+fcall_ro ~{prefix}ok*)"
    )
    options: dict[str, Any] = {"prefix": prefix, "on_error": "open", "deny_cache": False}
    lim: Any
    if flavor == "sync":
        lim = SyncAsAsync(Limiter(redis.Redis(port=s.port, username="twin", password="pw"), **options))
    else:
        lim = AsyncLimiter(aredis.Redis(port=s.port, username="twin", password="pw"), **options)
    try:
        g = GCRA(1, 1, 3600)
        for key in ("ok1", "other"):
            d = await lim.check(key, g)  # FCALL rl_gcra, as the user's root permissions allow
            assert d.allowed and d.source is Source.FALLBACK
        admin.config_set("maxmemory", 1)
        try:
            denied = await lim.check("ok1", g)  # OOM, then the twin, allowed on this key
            assert not denied.allowed and not denied.degraded
            # Redis 7.0: "... one of the keys used as arguments"; Valkey: "... access a key".
            with pytest.raises(redis.exceptions.NoPermissionError, match="key"):
                await lim.check("other", g)
            assert lim.counters["degraded"] == 0
        finally:
            admin.config_set("maxmemory", 0)
        assert not (await lim.check("other", g)).allowed
    finally:
        await close_limiter(lim)
        admin.close()
        s.close()
