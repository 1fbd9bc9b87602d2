"""check_all (and check) on a three-master Redis Cluster through redis-py's cluster clients,
sync and asyncio, in both modes: hash-tagged keys land on several masters, each call goes
to its slot's master, and untagged multi-key calls are refused with CROSSSLOT."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import GCRA, AsyncLimiter, Limiter, Mode, Window, tag
from .conftest import RedisCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module", params=["module", "fallback"])
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, RedisCluster]]:
    c = RedisCluster(module=request.param == "module")
    yield str(request.param), c
    c.close()


def masters_of(cluster: RedisCluster, keys: list[str]) -> set[int]:
    c = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        return {c.get_node_from_key(k).port for k in keys}
    finally:
        c.close()


def test_check_all_on_three_masters(cluster: tuple[str, RedisCluster]) -> None:
    mode, cl = cluster
    client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = Limiter(client, prefix="c:")
    try:
        assert lim.mode is (Mode.MODULE if mode == "module" else Mode.FALLBACK)
        users = [f"user{i}" for i in range(12)]
        assert len(masters_of(cl, [tag(u) for u in users])) == 3  # every master serves some
        for u in users:
            limits = {tag(u, "api"): GCRA(3, 1, 60), tag(u, "ip"): Window(2, 60, "SLIDING")}
            got = [lim.check_all(limits).allowed for _ in range(3)]
            assert got == [True, True, False], u
            assert lim.check(tag(u, "api"), GCRA(3, 1, 60), cost=0).remaining == 1
        with pytest.raises(redis.exceptions.RedisClusterException, match="(?i)slot"):
            lim.check_all({"a-user": GCRA(1, 1, 1), "b-user": GCRA(1, 1, 1)})
    finally:
        lim.close()
        client.close()


async def test_async_check_all_on_three_masters(cluster: tuple[str, RedisCluster]) -> None:
    mode, cl = cluster
    client = aredis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = AsyncLimiter(client, prefix="ac:")
    try:
        for i in range(6):
            limits = {tag(f"u{i}", "a"): GCRA(2, 1, 60), tag(f"u{i}", "b"): Window(5, 60, "FIXED")}
            got = [(await lim.check_all(limits)).allowed for _ in range(3)]
            assert got == [True, True, False]
        assert await lim.resolved_mode() is (Mode.MODULE if mode == "module" else Mode.FALLBACK)
    finally:
        await lim.aclose()
        await client.aclose()
