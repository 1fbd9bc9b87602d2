"""Errors reach the user the same way whichever side answers: the same misuse raises the same
exception class with the same text from the module (RL.*) and from the Lua fallback (FCALL),
sync and asyncio, and never turns into a degraded decision."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import GCRA, AsyncLimiter, Lease, Limiter, Window

from .conftest import RedisServer

pytestmark = pytest.mark.asyncio

Call = Callable[[Any], Awaitable[Any]]


async def run(lim: Any, method: str, *a: Any, **kw: Any) -> Any:
    out = getattr(lim, method)(*a, **kw)
    return await out if hasattr(out, "__await__") else out


async def hold_lease_then(lim: Any, key: str, then: Call) -> Any:
    """hold_lease_then makes `key` a LEASE key (one slot, long lease), then runs `then`."""
    await run(lim, "check_all", {key: Lease(5, 60)}, tokens={key: "holder"})
    return await then(lim)


async def gcra_then_fixed(lim: Any, key: str) -> Any:
    await run(lim, "check", key, GCRA(5, 1, 1))
    return await run(lim, "check", key, Window(5, 60, "FIXED"))


async def wrongtype(lim: Any) -> Any:
    raw = lim.redis
    out = raw.set(lim.prefix + "str", "x")
    if hasattr(out, "__await__"):
        await out
    return await run(lim, "check", "str", GCRA(5, 1, 1))


MISUSES: dict[str, Call] = {
    "force with LOG": lambda lim: run(lim, "check", "log", Window(10, 60, "LOG"), force=True),
    "force with PEEK": lambda lim: run(lim, "check", "peek", GCRA(5, 1, 1), peek=True, force=True),
    "force with MAXWAIT": lambda lim: run(lim, "check", "mw", GCRA(5, 1, 1), max_wait=1, force=True),
    "force on a LEASE spec": lambda lim: run(
        lim, "check_all", {"{a}:r": GCRA(5, 1, 1), "{a}:l": Lease(2, 10)}, tokens={"{a}:l": "t"}, force=True
    ),
    "GCRA on a LEASE key": lambda lim: hold_lease_then(lim, "lk", lambda l2: run(l2, "check", "lk", GCRA(5, 1, 1))),
    "REFUND on a LEASE key": lambda lim: hold_lease_then(lim, "rk", lambda l2: run(l2, "refund", "rk", 1)),
    "FIXED on a GCRA key": lambda lim: gcra_then_fixed(lim, "gk"),
    "LOG above rl.log-max-limit": lambda lim: run(lim, "check", "big", Window(100001, 60, "LOG")),
    "LEASE above rl.lease-max-limit": lambda lim: run(lim, "acquire", "bigl", Lease(10001, 60)),
    "WRONGTYPE": wrongtype,
}


async def error_of(server: RedisServer, flavor: str, name: str) -> tuple[type[BaseException], str]:
    prefix = "err:"
    lim: Any
    if flavor == "sync":
        lim = Limiter(server.client(), prefix=prefix)
    else:
        lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), prefix=prefix)
    admin = server.client()
    admin.delete(*[k for k in admin.scan_iter(prefix + "*")] or ["-"])
    try:
        with pytest.raises(Exception) as info:
            result = await MISUSES[name](lim)
            if hasattr(result, "__enter__"):  # a Held: give it back
                result.release()
        assert lim.counters["degraded"] == 0
        return type(info.value), str(info.value)
    finally:
        admin.delete(*[k for k in admin.scan_iter(prefix + "*")] or ["-"])
        admin.close()
        if flavor == "sync":
            lim.close()
            lim.redis.close()
        else:
            await lim.aclose()
            await lim.redis.aclose()


@pytest.mark.parametrize("flavor", ["sync", "async"])
@pytest.mark.parametrize("name", list(MISUSES))
async def test_module_and_fallback_raise_the_same_error(
    name: str, flavor: str, module_server: RedisServer, plain_server: RedisServer
) -> None:
    module_error = await error_of(module_server, flavor, name)
    fallback_error = await error_of(plain_server, flavor, name)
    assert issubclass(module_error[0], redis.ResponseError), module_error
    assert module_error == fallback_error
