"""The fallback where users are (docs/clients.md#the-fallback-where-users-are): on a server
that allows no Functions library (Redis 6.x, FUNCTION renamed away, FCALL denied by ACL) the
Lua fallback runs as scripts, EVAL first and EVALSHA once the server has the text, NOSCRIPT
recovered once by sending the text to that node (a restart, SCRIPT FLUSH, a Cluster node that
never had it); with neither the module nor any scripting, one clear error says what is
missing. Chosen by asking the server, never by configuration."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from redis_rl import GCRA, AsyncLimiter, Lease, LeaseLost, Limiter, LimiterError, Mode, Source, Window, tag

from .conftest import SERVER_MAJOR, RedisCluster, RedisServer, SyncAsAsync, close_limiter, renamed_away

NO_FUNCTION = renamed_away("FUNCTION")


@pytest.fixture(scope="module")
def no_functions() -> Iterator[RedisServer]:
    """no_functions is a server without the module whose FUNCTION command is renamed away."""
    s = RedisServer(module=False, extra=NO_FUNCTION)
    yield s
    s.close()


def make(flavor: str, port: int, prefix: str, **kw: Any) -> Any:
    if flavor == "sync":
        return SyncAsAsync(Limiter(redis.Redis(port=port, **kw), prefix=prefix))
    return AsyncLimiter(aredis.Redis(port=port, **kw), prefix=prefix)


def stats(server: RedisServer) -> dict[str, int]:
    c = server.client()
    try:
        got = {k.removeprefix("cmdstat_").lower(): v["calls"] for k, v in c.info("commandstats").items()}
    finally:
        c.close()
    if SERVER_MAJOR < 7 and "script" in got:  # 6.x counts no subcommands: SCRIPT is LOAD here
        got["script|load"] = got.pop("script")
    return got


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_without_functions_the_fallback_runs_as_scripts(
    no_functions: RedisServer, flavor: str, prefix: str
) -> None:
    lim = make(flavor, no_functions.port, prefix)
    try:
        no_functions.client().config_resetstat()
        g = GCRA(3, 1, 60)
        got = [await lim.check("g", g) for _ in range(4)]
        assert [d.allowed for d in got] == [True, True, True, False]
        assert all(d.source is Source.FALLBACK for d in got)
        calls = stats(no_functions)
        assert calls.get("eval") == 1 and calls.get("evalsha") == 3  # the text once, then its SHA1
        both = await lim.check_all({"{u}:a": Window(2, 60, "FIXED"), "{u}:b": GCRA(5, 1, 60)})
        assert both.allowed and both.remaining == 1
        assert (await lim.refund("g", 1)).refunded == 1
        async with lim.acquire("job", Lease(1, 30)) as held:
            assert held.decision.allowed
        inner = lim.inner if isinstance(lim, SyncAsAsync) else lim
        assert inner._state.scripts
    finally:
        await close_limiter(lim)


async def test_renew_and_leaselost_as_scripts(no_functions: RedisServer, prefix: str) -> None:
    lim = Limiter(no_functions.client(), prefix=prefix)
    admin = Limiter(no_functions.client(), prefix=prefix)
    try:
        with pytest.raises(LeaseLost, match="no longer held"):
            with lim.acquire("rel", Lease(1, "1.5"), token="t") as held:
                assert admin.release("rel", "t").released == 1
                import time

                end = time.monotonic() + 20
                while not held._lost:
                    assert time.monotonic() < end
                    time.sleep(0.02)
    finally:
        lim.close()
        admin.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_noscript_is_recovered_once(no_functions: RedisServer, flavor: str, prefix: str) -> None:
    lim = make(flavor, no_functions.port, prefix)
    try:
        w = Window(5, 60)
        assert (await lim.check("n", w)).remaining == 4
        c = no_functions.client()
        c.script_flush()  # as a restart without persistence would
        c.config_resetstat()
        assert (await lim.check("n", w)).remaining == 3
        calls = stats(no_functions)
        # One EVALSHA answered NOSCRIPT, one EVAL sent the text: the call went on.
        assert calls.get("evalsha") == 1 and calls.get("eval") == 1
        assert (await lim.check("n", w)).remaining == 2
        assert stats(no_functions).get("evalsha") == 2
        c.close()
    finally:
        await close_limiter(lim)


def acl_user(server: RedisServer, *rules: str) -> tuple[str, str]:
    name = f"u{uuid.uuid4().hex[:8]}"
    c = server.client()
    c.execute_command("ACL", "SETUSER", name, "on", ">pw", "~*", "+@all", *rules)
    c.close()
    return name, "pw"


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_an_acl_that_denies_functions_gets_scripts(plain_server: RedisServer, flavor: str, prefix: str) -> None:
    # A managed service that disables FUNCTION (and FCALL) for its users: scripts answer.
    name, pw = acl_user(plain_server, "-function", "-fcall", "-fcall_ro")
    lim = make(flavor, plain_server.port, prefix, username=name, password=pw)
    try:
        d = await lim.check("acl", GCRA(2, 1, 60))
        assert d.allowed and d.source is Source.FALLBACK
        inner = lim.inner if isinstance(lim, SyncAsAsync) else lim
        assert inner._state.scripts
    finally:
        await close_limiter(lim)


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_no_module_and_no_scripting_is_one_clear_error(
    plain_server: RedisServer, flavor: str, prefix: str
) -> None:
    name, pw = acl_user(plain_server, "-@scripting")
    lim = make(flavor, plain_server.port, prefix, username=name, password=pw)
    try:
        with pytest.raises(LimiterError, match="no redis-rl module .* Functions library .* scripts"):
            await lim.check("none", GCRA(2, 1, 60))
        assert lim.counters["degraded"] == 0  # a misconfiguration, not an outage
    finally:
        await close_limiter(lim)


def test_a_cluster_node_without_the_text_gets_it_once() -> None:
    # Three masters without Functions: the first call sends the text to its node (EVAL);
    # a key on another master is tried by SHA1 there, answered NOSCRIPT, and sent the text.
    cl = RedisCluster(module=False, extra=NO_FUNCTION)
    client = redis.RedisCluster(host="127.0.0.1", port=cl.nodes[0].port)
    lim = Limiter(client, prefix="cs:")
    try:
        users = [f"user{i}" for i in range(12)]
        got = [lim.check(tag(u, "a"), GCRA(2, 1, 60)) for u in users for _ in range(3)]
        assert [d.allowed for d in got] == [True, True, False] * 12
        per_node = []
        for n in cl.nodes:
            c = n.client()
            s = {k.removeprefix("cmdstat_").lower(): v["calls"] for k, v in c.info("commandstats").items()}
            per_node.append((s.get("eval", 0), s.get("evalsha", 0)))
            c.close()
        assert all(e >= 1 for e, _ in per_node)  # every master got the text (EVAL) once…
        assert sum(e for e, _ in per_node) == 3
        assert sum(e + sha for e, sha in per_node) == 36 + 2  # …and two EVALSHA met NOSCRIPT
    finally:
        lim.close()
        client.close()
        cl.close()


def server_with(*renamed: str) -> RedisServer:
    """server_with is a server without the module whose `renamed` commands are renamed away."""
    return RedisServer(module=False, extra=renamed_away(*renamed))


async def run_burst(lim: Any) -> None:
    """run_burst: three decisions, a check_all, a refund and a lease, all from the fallback."""
    got = [await lim.check("b", GCRA(2, 1, 60)) for _ in range(3)]
    assert [d.allowed for d in got] == [True, True, False]
    assert all(d.source is Source.FALLBACK and not d.degraded for d in got)
    both = await lim.check_all({"{u}:a": Window(2, 60, "FIXED"), "{u}:b": GCRA(5, 1, 60)})
    assert both.allowed and both.remaining == 1
    assert (await lim.refund("b", 1)).refunded == 1
    async with lim.acquire("job", Lease(1, 30)) as held:
        assert held.decision.allowed


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_evalsha_renamed_away_every_call_sends_the_text(flavor: str, prefix: str) -> None:
    # FUNCTION and EVALSHA renamed away: EVAL still runs the fallback (the text each time).
    s = server_with("FUNCTION", "EVALSHA")
    lim = make(flavor, s.port, prefix)
    try:
        await run_burst(lim)
        calls = stats(s)
        assert calls.get("eval", 0) >= 6 and "evalsha" not in calls, calls
        before = calls["eval"]
        assert (await lim.check("b", GCRA(2, 1, 60))).allowed  # the refund gave one back
        assert stats(s)["eval"] == before + 1  # one EVAL per call, nothing tried first
    finally:
        await close_limiter(lim)
        s.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_eval_renamed_away_runs_by_script_load_and_evalsha(flavor: str, prefix: str) -> None:
    # FUNCTION and EVAL renamed away: the text goes by SCRIPT LOAD, the calls by EVALSHA,
    # and NOSCRIPT (the cache flushed, as by a restart) loads it again once.
    s = server_with("FUNCTION", "EVAL")
    lim = make(flavor, s.port, prefix)
    try:
        await run_burst(lim)
        calls = stats(s)
        assert calls.get("script|load") == 1 and calls.get("evalsha", 0) >= 6, calls
        c = s.client()
        c.script_flush()
        c.config_resetstat()
        c.close()
        assert (await lim.check("b", GCRA(2, 1, 60))).allowed
        calls = stats(s)
        # One EVALSHA met NOSCRIPT, SCRIPT LOAD sent the text, the EVALSHA again: decided.
        assert (calls.get("evalsha"), calls.get("script|load")) == (2, 1), calls
        assert not (await lim.check("b", GCRA(2, 1, 60))).allowed
        assert (stats(s).get("evalsha"), stats(s).get("script|load")) == (3, 1)
    finally:
        await close_limiter(lim)
        s.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
@pytest.mark.parametrize("denied", ["-evalsha", "-eval"])
async def test_an_acl_that_denies_one_script_command_uses_the_other(
    plain_server: RedisServer, flavor: str, denied: str, prefix: str
) -> None:
    name, pw = acl_user(plain_server, "-function", "-fcall", "-fcall_ro", denied)
    lim = make(flavor, plain_server.port, prefix, username=name, password=pw)
    try:
        await run_burst(lim)
        assert lim.counters["errors"] == 0
    finally:
        await close_limiter(lim)


@pytest.mark.parametrize("flavor", ["sync", "async"])
@pytest.mark.parametrize(
    "renamed", [("FUNCTION", "EVAL", "EVALSHA"), ("FCALL", "FCALL_RO", "EVAL", "EVALSHA")], ids=["function", "fcall"]
)
async def test_everything_renamed_away_is_one_clear_error(flavor: str, renamed: tuple[str, ...], prefix: str) -> None:
    s = server_with(*renamed)
    lim = make(flavor, s.port, prefix)
    try:
        for _ in range(2):  # every call, the same error (not an outage, not a second kind)
            with pytest.raises(LimiterError, match="no redis-rl module .* Functions library .* scripts"):
                await lim.check("none", GCRA(2, 1, 60))
        assert (lim.counters["degraded"], lim.counters["errors"]) == (0, 0)
    finally:
        await close_limiter(lim)
        s.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_a_key_the_acl_forbids_is_not_taken_for_no_scripting(flavor: str, prefix: str) -> None:
    # As scripts, a NOPERM on the key (the user's key patterns) is the server's own error,
    # not "no scripting here".
    s = server_with("FUNCTION")
    c = s.client()
    c.execute_command("ACL", "SETUSER", "keys", "on", ">pw", f"~{prefix}ok*", "+@all")
    c.close()
    lim = make(flavor, s.port, prefix, username="keys", password="pw")
    try:
        assert (await lim.check("ok1", GCRA(2, 1, 60))).allowed
        with pytest.raises(redis.exceptions.NoPermissionError) as caught:
            await lim.check("other", GCRA(2, 1, 60))
        assert not isinstance(caught.value, LimiterError)
    finally:
        await close_limiter(lim)
        s.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_lua_switched_off_is_one_clear_error(flavor: str, prefix: str) -> None:
    # Valkey 9.1 runs Lua as an engine module an operator can unload: then neither the
    # library nor scripts can run, and the client says so (not "Engine 'lua' not found").
    s = RedisServer(module=False)
    try:
        c = s.client()
        modules = [m.get("name", m.get(b"name")) for m in c.module_list()]
        if "lua" not in modules and b"lua" not in modules:
            c.close()
            pytest.skip("Lua is built into this server (only Valkey 9+ can switch it off)")
        c.execute_command("MODULE", "UNLOAD", "lua")
        c.close()
        lim = make(flavor, s.port, prefix)
        try:
            for _ in range(2):
                with pytest.raises(LimiterError, match="no redis-rl module .* Functions library .* scripts"):
                    await lim.check("none", GCRA(2, 1, 60))
            assert (lim.counters["degraded"], lim.counters["errors"]) == (0, 0)
        finally:
            await close_limiter(lim)
    finally:
        s.close()


#: Concurrent first calls per round, and rounds (each a new limiter: a new pool, nothing
#: learned yet). Their EVALs (or EVALSHAs) are sent before the first refusal is read.
CALLERS, ROUNDS = 16, 6


async def first_calls_at_once(flavor: str, port: int, prefix: str, *, warm: bool, **kw: Any) -> list[Any]:
    """first_calls_at_once: a new limiter learns the server allows no Functions (the mode
    detected, no decision yet), takes one decision if `warm` (EVAL: the server has the text,
    the next calls go by SHA1), then CALLERS decisions on their own keys at once: asyncio
    tasks (gather) or threads released together. Their answers, or what they raised."""
    g = GCRA(1, 1, 3600)
    if flavor == "async":
        alim = AsyncLimiter(aredis.Redis(port=port, **kw), prefix=prefix)
        try:
            assert await alim.resolved_mode() is Mode.FALLBACK
            if warm:
                assert (await alim.check("warm", g)).allowed
            return list(
                await asyncio.gather(*(alim.check(f"c{i}", g) for i in range(CALLERS)), return_exceptions=True)
            )
        finally:
            await close_limiter(alim)
    lim = Limiter(redis.Redis(port=port, **kw), prefix=prefix)
    try:
        assert lim.mode is Mode.FALLBACK
        if warm:
            assert lim.check("warm", g).allowed
        start = threading.Barrier(CALLERS)

        def one(i: int) -> Any:
            start.wait(timeout=30)
            return lim.check(f"c{i}", g)

        with ThreadPoolExecutor(CALLERS) as pool:
            futures = [pool.submit(one, i) for i in range(CALLERS)]
            return [f.exception(timeout=60) or f.result() for f in futures]
    finally:
        lim.close()
        lim.redis.close()


def script_user(server: RedisServer, refused: str) -> dict[str, str]:
    """script_user: the credentials of a user denied FUNCTION, FCALL, FCALL_RO and `refused`."""
    name, pw = acl_user(server, "-function", "-fcall", "-fcall_ro", f"-{refused.lower()}")
    return {"username": name, "password": pw}


@pytest.mark.parametrize("flavor", ["sync", "async"])
@pytest.mark.parametrize("by", ["rename", "acl"])
@pytest.mark.parametrize("refused", ["EVAL", "EVALSHA"])
async def test_concurrent_first_calls_refused_one_form_all_use_the_other(
    flavor: str, by: str, refused: str, prefix: str
) -> None:
    # docs/clients.md#the-fallback-where-users-are: calls refused EVAL (or EVALSHA) at the
    # same moment each go on in the other form; the refusal one of them recorded first is no
    # reason for the others to report "no scripting". (It failed so before: of a round's
    # calls, those that read their refusal after the first raised the one clear error.)
    s = server_with("FUNCTION", refused) if by == "rename" else server_with()
    kw = script_user(s, refused) if by == "acl" else {}
    try:
        for round_ in range(ROUNDS):
            got = await first_calls_at_once(flavor, s.port, f"{prefix}{round_}:", warm=refused == "EVALSHA", **kw)
            failed = [x for x in got if isinstance(x, BaseException)]
            assert not failed, f"round {round_}: {len(failed)} of {CALLERS} calls failed: {failed[0]!r}"
            assert all(d.allowed and d.source is Source.FALLBACK and not d.degraded for d in got)
        calls = stats(s)
        # Every decision was taken once, by the form the server allows.
        other = "evalsha" if refused == "EVAL" else "eval"
        assert calls.get(other, 0) >= ROUNDS * CALLERS, calls
        if refused == "EVAL":
            assert calls.get("script|load", 0) >= ROUNDS, calls
    finally:
        s.close()


@pytest.mark.parametrize("flavor", ["sync", "async"])
async def test_concurrent_first_calls_without_any_scripting_all_get_the_clear_error(flavor: str, prefix: str) -> None:
    # Both forms refused: every one of the concurrent calls ends with the one clear error
    # (none with the server's raw refusal, none with "kept failing").
    s = server_with("FUNCTION", "EVAL", "EVALSHA")
    try:
        for round_ in range(2):
            got = await first_calls_at_once(flavor, s.port, f"{prefix}{round_}:", warm=False)
            assert all(isinstance(x, LimiterError) for x in got), got
            assert all("no redis-rl module" in str(x) and "scripts" in str(x) for x in got), got[0]
    finally:
        s.close()
