"""A Cluster that grows under a running limiter (docs/clients.md#the-fallback-where-users-are):
a master added with CLUSTER MEET after the limiter started, and a slot that holds a limited
key moved to it (SETSLOT IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE, as `redis-cli
--cluster reshard` does). The new node has neither the Functions library nor the script
cached; the first call whose key lands there is decided there, from the migrated state, with
one load on that node (FUNCTION LOAD as a library, one EVAL as scripts) and no load anywhere
else. Sync and asyncio, with the Functions library and as scripts (FUNCTION renamed away)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import AsyncLimiter, Limiter, Source, Window, tag
from redis_rl._protocol import library_code, library_version

from .conftest import SERVER_MAJOR, RedisCluster, RedisServer, command_stats, renamed_away

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio]

NO_FUNCTION = renamed_away("FUNCTION")


@pytest.fixture(scope="module", params=["functions", "scripts"] if SERVER_MAJOR >= 7 else ["scripts"])
def grown(request: pytest.FixtureRequest) -> Iterator[tuple[str, RedisCluster]]:
    """grown is a three-master cluster without the module (FUNCTION renamed away for
    "scripts"); each test adds a master of its own."""
    c = RedisCluster(module=False, extra=NO_FUNCTION if request.param == "scripts" else ())
    yield str(request.param), c
    c.close()


def loads(stats: dict[str, int], how: str) -> int:
    """loads counts what put the fallback on a node: FUNCTION LOAD, or EVAL (the text)."""
    return stats.get("function|load", 0) if how == "functions" else stats.get("eval", 0)


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_a_master_added_after_start_gets_the_fallback_once(
    grown: tuple[str, RedisCluster], flavor: str
) -> None:
    how, cl = grown
    prefix = f"g{uuid.uuid4().hex[:8]}:"
    limit = Window(10, 3600, "LOG")  # exact counts however long the test takes
    lim: Any
    if flavor == "sync":
        lim = Limiter(redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port), prefix=prefix)
    else:
        lim = AsyncLimiter(aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port), prefix=prefix)

    async def check(key: str) -> Any:
        r = lim.check(key, limit)
        return await r if flavor == "async" else r

    try:
        # Hash tags of this test's own, so the moved slot is one of the first three masters'.
        keys = [tag(f"{prefix}user{i}", "api") for i in range(12)]
        for k in keys:
            d = await check(k)
            assert d.allowed and d.remaining == 9 and d.source is Source.FALLBACK
        before = {n.port: command_stats(n) for n in cl.nodes}
        new: RedisServer = cl.add_master()
        probe = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
        slot = probe.keyslot(prefix + keys[0])
        probe.close()
        cl.move_slot(slot, new)
        assert cl.owner_of_slot(slot) is new
        assert loads(command_stats(new), how) == 0

        d = await check(keys[0])  # routed by the limiter's old slot table: MOVED, then the new node
        assert d.allowed and not d.degraded and d.source is Source.FALLBACK
        assert d.remaining == 8, "decided on the new node from the migrated key"
        on_new = command_stats(new)
        assert loads(on_new, how) == 1, on_new
        if how == "functions":
            c = new.client()
            assert c.execute_command("FCALL_RO", "rl_version", 0).decode() == library_version(library_code())
            c.close()

        assert (await check(keys[0])).remaining == 7
        on_new = command_stats(new)
        assert loads(on_new, how) == 1, "loaded once, not per call"
        if how == "scripts":
            assert on_new.get("evalsha", 0) >= 1, "by SHA1 once the node has the text"
        for n in cl.nodes[:-1]:
            assert loads(command_stats(n), how) == loads(before[n.port], how), f"no load on {n.port}"
        for k in keys[1:]:
            assert (await check(k)).remaining == 8
        assert (lim.counters["errors"], lim.counters["degraded"]) == (0, 0)
    finally:
        if flavor == "sync":
            lim.close()
            lim.redis.close()
        else:
            await lim.aclose()
            await lim.redis.aclose()


@pytest.mark.skipif(SERVER_MAJOR < 7, reason="Redis 6.x has no Functions")
async def test_a_newer_library_on_one_master_leaves_the_others_loaded() -> None:
    # A rolling deploy reached one master first: the older client keeps the newer library
    # there and still loads its own where none is (each master has its own plan).
    cl = RedisCluster(module=False)
    try:
        c = cl.nodes[0].client()
        code = library_code().replace(
            f"local VERSION = '{library_version(library_code())}'", "local VERSION = '99.0.0'"
        )
        c.execute_command("FUNCTION", "LOAD", code)
        c.close()
        lim = Limiter(redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port), prefix="nw:")
        try:
            keys = [tag(f"user{i}", "api") for i in range(12)]
            assert all(lim.check(k, Window(5, 3600, "LOG")).allowed for k in keys)
            versions = []
            for n in cl.nodes:
                nc = n.client()
                versions.append(nc.execute_command("FCALL_RO", "rl_version", 0).decode())
                nc.close()
            ours = library_version(library_code())
            assert versions == ["99.0.0", ours, ours]
        finally:
            lim.close()
            lim.redis.close()
    finally:
        cl.close()
