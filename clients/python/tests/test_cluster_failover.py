"""A replica promoted to master under a running limiter
(docs/clients.md#the-fallback-where-users-are): three masters, one of them with a replica,
the limiter started, then the replica made master (CLUSTER FAILOVER once its copy caught up;
TAKEOVER where the manual failover does not complete). The limiter's slot table still names
the old master: its first call there is MOVED to the new one.

As scripts (FUNCTION renamed away) the replica never got the script: Redis 7 replicates a
script's effects, not its text, so EVALSHA there answers NOSCRIPT. That call is recovered
once, by one EVAL on the new master (one more Redis call, nothing degraded), and decided
from the replicated state; EVALSHA again from then on, and no load anywhere else. As a
library the replica got the library with the data: the limiter calls it there with no
FUNCTION LOAD anywhere and no second Redis call. Sync and asyncio."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import AsyncLimiter, Limiter, Source, Window, tag
from redis_rl._protocol import library_code, library_version

from .conftest import SERVER_MAJOR, RedisCluster, command_stats, renamed_away

pytestmark = [pytest.mark.cluster, pytest.mark.asyncio]


@pytest.fixture(params=["functions", "scripts"] if SERVER_MAJOR >= 7 else ["scripts"])
def how(request: pytest.FixtureRequest) -> Iterator[str]:
    yield str(request.param)


def loads(stats: dict[str, int], how: str) -> int:
    """loads counts what put the fallback on a node: FUNCTION LOAD, or EVAL (the text)."""
    return stats.get("function|load", 0) if how == "functions" else stats.get("eval", 0)


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_a_replica_promoted_after_start_answers_exactly(how: str, flavor: str) -> None:
    cl = RedisCluster(module=False, extra=renamed_away("FUNCTION") if how == "scripts" else ())
    lim: Any = None
    try:
        prefix = f"p{uuid.uuid4().hex[:8]}:"
        limit = Window(10, 3600, "LOG")  # exact counts however long the test takes
        keys = [tag(f"{prefix}user{i}", "api") for i in range(12)]
        probe = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
        slot = probe.keyslot(prefix + keys[0])
        probe.close()
        master = cl.owner_of_slot(slot)
        replica = cl.add_replica(master)

        if flavor == "sync":
            lim = Limiter(redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port), prefix=prefix)
        else:
            lim = AsyncLimiter(aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port), prefix=prefix)

        async def check(key: str) -> Any:
            r = lim.check(key, limit)
            return await r if flavor == "async" else r

        for k in keys:
            d = await check(k)
            assert d.allowed and d.remaining == 9 and d.source is Source.FALLBACK
        assert (await check(keys[0])).remaining == 8
        if how == "functions":
            # The master's FUNCTION LOAD reaches the replica in its replication stream.
            rc = replica.client()
            deadline = time.monotonic() + 30
            while not rc.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "redis_rl"):
                assert time.monotonic() < deadline, "the library did not reach the replica"
                time.sleep(0.05)
            rc.close()
        before = {n.port: command_stats(n) for n in cl.nodes}

        way = cl.fail_over(replica)
        assert cl.owner_of_slot(slot) is replica, way

        calls = lim.counters["redis_calls"]
        d = await check(keys[0])  # routed by the limiter's old slot table: MOVED, then the replica
        assert d.allowed and not d.degraded and d.source is Source.FALLBACK, (way, d)
        assert d.remaining == 7, f"decided on the promoted replica from the replicated state ({way})"
        on_new = command_stats(replica)
        if how == "scripts":
            # EVALSHA met NOSCRIPT there, then the text once: one recovery, one more call.
            assert loads(on_new, how) == loads(before[replica.port], how) + 1, (way, on_new)
            assert on_new.get("evalsha", 0) == before[replica.port].get("evalsha", 0) + 1, (way, on_new)
            assert lim.counters["redis_calls"] == calls + 2, way
        else:
            # The library was there already: one FCALL, nothing loaded.
            assert lim.counters["redis_calls"] == calls + 1, way
            assert on_new.get("fcall", 0) == before[replica.port].get("fcall", 0) + 1, (way, on_new)
            c = replica.client()
            assert c.execute_command("FCALL_RO", "rl_version", 0).decode() == library_version(library_code())
            c.close()

        assert (await check(keys[0])).remaining == 6
        on_new = command_stats(replica)
        assert loads(on_new, how) == loads(before[replica.port], how) + (how == "scripts"), (
            "loaded once, not per call"
        )
        if how == "scripts":
            assert on_new.get("evalsha", 0) == before[replica.port].get("evalsha", 0) + 2, "by SHA1 again"
        for k in keys[1:]:
            assert (await check(k)).remaining == 8
        for n in cl.nodes:
            if n is not replica:
                assert loads(command_stats(n), how) == loads(before[n.port], how), f"no load on {n.port} ({way})"
        assert (lim.counters["errors"], lim.counters["degraded"]) == (0, 0)
    finally:
        if lim is not None:
            if flavor == "sync":
                lim.close()
                lim.redis.close()
            else:
                await lim.aclose()
                await lim.redis.aclose()
        cl.close()
