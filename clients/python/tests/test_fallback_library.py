"""The Lua fallback's life cycle on a real server without the module, sync and asyncio: the
limiter loads the Functions library when it is missing (FUNCTION LOAD REPLACE), replaces an
older version (by `rl_version`) keeping the server's settings, leaves a newer one alone,
obeys load_library=False, and recovers when the library is flushed or the module unloaded
in the middle of a run."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import GCRA, AsyncLimiter, Limiter, LimiterError, Mode, Source, Window
from redis_rl._protocol import library_code, library_version

from .conftest import RedisServer

pytestmark = pytest.mark.asyncio

OURS = library_version(library_code())


@pytest.fixture(scope="module")
def bare() -> Iterator[RedisServer]:
    """bare is a server without the module that these tests may load and flush libraries on."""
    s = RedisServer(module=False)
    yield s
    s.close()


@pytest.fixture
def admin(bare: RedisServer) -> Iterator[redis.Redis]:
    c = bare.client()
    c.execute_command("FUNCTION", "FLUSH")
    c.flushall()
    yield c
    c.execute_command("FUNCTION", "FLUSH")
    c.close()


def variant(version: str, log_max_limit: int | None = None, **settings: int) -> str:
    """variant is our library with another VERSION line (and LOG_MAX_LIMIT, or any setting
    line named by its variable: ALL_MAX_KEYS=8), as an older or newer client, or an
    operator's edit, would have loaded it."""
    code = re.sub(r"^local VERSION = '[^']+'$", f"local VERSION = '{version}'", library_code(), flags=re.M)
    if log_max_limit is not None:
        settings["LOG_MAX_LIMIT"] = log_max_limit
    for variable, value in settings.items():
        code, n = re.subn(rf"^local {variable} = \d+$", f"local {variable} = {value}", code, flags=re.M)
        assert n == 1, variable
    return code


def server_version(c: redis.Redis) -> str | None:
    try:
        v = c.execute_command("FCALL_RO", "rl_version", 0)
    except redis.ResponseError:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def server_config(c: redis.Redis) -> dict[str, Any]:
    reply = c.execute_command("FCALL_RO", "rl_config", 0)
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2])}


async def check_once(flavor: str, server: RedisServer, **options: Any) -> Any:
    """check_once makes one decision with a new limiter (a new connection pool, so the
    detection runs afresh) and closes it."""
    if flavor == "sync":
        lim = Limiter(server.client(), **options)
        try:
            return lim.check("lib-test", GCRA(5, 1, 1))
        finally:
            lim.close()
            lim.redis.close()
    alim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port), **options)
    try:
        return await alim.check("lib-test", GCRA(5, 1, 1))
    finally:
        await alim.aclose()
        await alim.redis.aclose()


@pytest.fixture(params=["sync", "async"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_the_library_is_loaded_when_missing(flavor: str, bare: RedisServer, admin: redis.Redis) -> None:
    assert server_version(admin) is None
    d = await check_once(flavor, bare)
    assert d.allowed and d.source is Source.FALLBACK
    assert server_version(admin) == OURS
    (entry,) = admin.function_list("redis_rl", withcode=True)
    fields = dict(zip(entry[::2], entry[1::2]))
    assert fields[b"library_code"].decode() == library_code()  # the packaged text, unchanged


async def test_an_older_version_is_replaced_keeping_the_servers_settings(
    flavor: str, bare: RedisServer, admin: redis.Redis
) -> None:
    admin.execute_command(
        "FUNCTION", "LOAD", variant("0.9.0", log_max_limit=500, LEASE_MAX_LIMIT=700, ALL_MAX_KEYS=8)
    )
    assert server_version(admin) == "0.9.0"
    d = await check_once(flavor, bare)
    assert d.allowed and d.source is Source.FALLBACK
    assert server_version(admin) == OURS
    # Every setting the operator edited survived the upgrade.
    config = server_config(admin)
    assert (config["log-max-limit"], config["lease-max-limit"], config["all-max-keys"]) == (500, 700, 8)
    with pytest.raises(redis.ResponseError, match="above rl.log-max-limit \\(500\\)"):
        admin.execute_command("FCALL", "rl_window", 1, "lib-log", 501, 60, "LOG")


async def test_a_library_without_rl_version_is_replaced(flavor: str, bare: RedisServer, admin: redis.Redis) -> None:
    # A library named redis_rl that answers no rl_version (say, an early build).
    admin.execute_command(
        "FUNCTION", "LOAD",
        "#!lua name=redis_rl\nredis.register_function('rl_gcra', function(keys, args) return 0 end)",
    )
    d = await check_once(flavor, bare)
    assert d.allowed and d.limit == 5
    assert server_version(admin) == OURS


async def test_a_newer_version_is_left_alone(
    flavor: str, bare: RedisServer, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    admin.execute_command("FUNCTION", "LOAD", variant("99.0.0"))
    with caplog.at_level(logging.WARNING, logger="redis_rl"):
        d = await check_once(flavor, bare)
    assert d.allowed and d.source is Source.FALLBACK
    assert server_version(admin) == "99.0.0"
    assert any("newer than ours" in r.getMessage() for r in caplog.records)


async def test_load_library_false_never_loads(
    flavor: str, bare: RedisServer, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(LimiterError, match="not loaded and load_library=False"):
        await check_once(flavor, bare, load_library=False)
    assert server_version(admin) is None
    admin.execute_command("FUNCTION", "LOAD", variant("0.9.0"))
    with caplog.at_level(logging.WARNING, logger="redis_rl"):
        d = await check_once(flavor, bare, load_library=False)
    assert d.allowed
    assert server_version(admin) == "0.9.0"
    assert any("load_library=False: not replaced" in r.getMessage() for r in caplog.records)


async def test_a_flushed_library_is_loaded_again_mid_run(flavor: str, bare: RedisServer, admin: redis.Redis) -> None:
    g = Window(3, 60, "FIXED")
    if flavor == "sync":
        lim: Any = Limiter(bare.client(), prefix=f"flush-{flavor}:")
    else:
        lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=bare.port), prefix=f"flush-{flavor}:")

    async def check() -> Any:
        r = lim.check("k", g)
        return await r if flavor == "async" else r

    try:
        assert (await check()).remaining == 2
        admin.execute_command("FUNCTION", "FLUSH")  # a restart without persistence, say
        d = await check()
        assert d.allowed and not d.degraded and d.source is Source.FALLBACK
        assert d.remaining == 1  # the key survived; only the library was gone
        assert server_version(admin) == OURS
    finally:
        if flavor == "sync":
            lim.close()
            lim.redis.close()
        else:
            await lim.aclose()
            await lim.redis.aclose()


async def test_auto_mode_moves_to_the_fallback_when_the_module_goes(flavor: str) -> None:
    # A failover to a server without the module: the server restarts, on the same port,
    # without it, under a live connection pool.
    server = RedisServer(module=True)
    try:
        if flavor == "sync":
            lim: Any = Limiter(server.client())
        else:
            lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=server.port))

        async def check() -> Any:
            r = lim.check("moving", GCRA(5, 1, 60))
            return await r if flavor == "async" else r

        first = await check()
        assert first.source is Source.MODULE and first.remaining == 4
        server.stop()
        server.module = False
        server.start()
        d = await check()
        assert d.allowed and not d.degraded and d.source is Source.FALLBACK and d.remaining == 4
        mode = lim.mode if flavor == "sync" else await lim.resolved_mode()
        assert mode is Mode.FALLBACK
        admin = server.client()
        assert server_version(admin) == OURS
        admin.close()
        if flavor == "sync":
            lim.close()
            lim.redis.close()
        else:
            await lim.aclose()
            await lim.redis.aclose()
    finally:
        server.close()


async def test_a_newer_library_loaded_while_we_looked_is_not_overwritten(
    flavor: str, bare: RedisServer, admin: redis.Redis
) -> None:
    # A rolling deploy: a newer client loads its library between this client's rl_version
    # (none there yet) and its FUNCTION LOAD. The load (no REPLACE) fails, the client looks
    # again, finds the newer version and keeps it.
    assert server_version(admin) is None
    if flavor == "sync":
        lim: Any = Limiter(bare.client())
    else:
        lim = AsyncLimiter(aredis.Redis(host="127.0.0.1", port=bare.port))
    real_on = lim._on

    def race(*args: Any) -> None:
        if args[1:3] == ("FUNCTION", "LOAD") and server_version(admin) is None:
            admin.execute_command("FUNCTION", "LOAD", variant("99.0.0"))

    if flavor == "sync":
        def on(*args: Any) -> Any:
            race(*args)
            return real_on(*args)
    else:
        async def on(*args: Any) -> Any:  # type: ignore[misc]
            race(*args)
            return await real_on(*args)
    lim._on = on
    try:
        d = lim.check("race", GCRA(5, 1, 1))
        d = await d if flavor == "async" else d
        assert d.allowed and d.source is Source.FALLBACK
        assert server_version(admin) == "99.0.0"
    finally:
        if flavor == "sync":
            lim.close()
            lim.redis.close()
        else:
            await lim.aclose()
            await lim.redis.aclose()


async def test_an_older_client_works_beside_a_newer_library_and_leaves_its_text(
    flavor: str, bare: RedisServer, admin: redis.Redis
) -> None:
    # Two library versions, as two client releases carry them: this package's text as the
    # "older" one, a copy of it with a higher VERSION as the "newer" one (a newer client's).
    # The newer replacing an older one, settings kept, is
    # test_an_older_version_is_replaced_keeping_the_servers_settings.
    newer = variant("99.0.0", log_max_limit=500)
    admin.execute_command("FUNCTION", "LOAD", newer)
    for _ in range(2):  # the older client works beside it, and leaves it in place
        d = await check_once(flavor, bare)
        assert d.allowed and d.source is Source.FALLBACK and not d.degraded
    (entry,) = admin.function_list("redis_rl", withcode=True)
    assert dict(zip(entry[::2], entry[1::2]))[b"library_code"].decode() == newer
    assert server_config(admin)["log-max-limit"] == 500  # the newer one's settings, too
