"""The asyncio limiter, over `redis.asyncio.Redis` or `redis.asyncio.RedisCluster`.

Same names and behaviour as the sync `Limiter`; the I/O methods are coroutines, `acquire`
works with `async with` (or `await`), and `aclose()` replaces `close()`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Callable, Generator, Hashable, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any

import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.asyncio.retry import Retry

from ._base import HeldBase, LimiterBase, LimitEntry, Refund, Release, duration_seconds
from ._decision import Decision, decision_from_reply, ms_to_timedelta
from ._limits import MAX_SECONDS, Lease, Limit, check_token, positive
from ._local import Credit
from ._policy import LimiterError, RateLimitExceeded, is_connection_level, is_unavailable
from ._protocol import (
    Arg,
    LibraryPlan,
    Mode,
    PARSE_ERRORS,
    ScriptStep,
    TWIN_OPS,
    check_command,
    cluster_route,
    command_exists,
    configured_code,
    frame,
    functions_refused,
    ints,
    is_missing_function,
    is_no_permission,
    is_oom,
    is_unknown_command,
    is_unknown_renew,
    library_code,
    library_version,
    parse_config,
    pool_state,
    script_body,
    script_recovery,
    scripting_refused,
    source_of,
    text,
    twin_frame,
    twin_missing,
)

__all__ = ["AsyncHeld", "AsyncLimiter"]


class AsyncLimiter(LimiterBase):
    """AsyncLimiter makes rate-limit decisions in Redis (asyncio). See `Limiter`.

    `timeout`, if given, bounds every Redis call with asyncio.wait_for on top of the
    client's own socket timeouts.
    """

    def __init__(
        self,
        client: aredis.Redis | aredis.RedisCluster,
        *,
        timeout: timedelta | float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(client, **options)
        self._state = pool_state(client)
        self._detect_lock: asyncio.Lock | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._pending: list[Credit] = []
        self.timeout = None if timeout is None else duration_seconds(timeout, "timeout")

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: timedelta | float = 0.5,
        cluster: bool = False,
        **options: Any,
    ) -> AsyncLimiter:
        """from_url builds the asyncio client (timeouts set, no retries) and the limiter."""
        t = duration_seconds(timeout, "timeout")
        kwargs: dict[str, Any] = {"socket_timeout": t, "socket_connect_timeout": t}
        client: aredis.Redis | aredis.RedisCluster
        if cluster:
            client = aredis.RedisCluster.from_url(url, **kwargs)
        else:
            client = aredis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **kwargs)
        return cls(client, timeout=min(t * 2, MAX_SECONDS), **options)

    # -- mode and the fallback library ----------------------------------------------------

    async def resolved_mode(self) -> Mode:
        """resolved_mode is the mode in use (MODULE or FALLBACK), detecting it if needed."""
        return await self._mode()

    async def _exec(self, *args: Arg, **kw: Any) -> Any:
        coro = self.redis.execute_command(*args, **kw)
        if self.timeout is None:
            return await coro
        return await asyncio.wait_for(coro, self.timeout)

    async def _mode(self) -> Mode:
        st = self._state
        if self._detect_lock is None:
            self._detect_lock = asyncio.Lock()
        mode: Mode
        if self.mode_setting is not Mode.AUTO:
            mode = self.mode_setting
        else:
            if st.mode is None:
                async with self._detect_lock:
                    if st.mode is None:
                        try:
                            reply = await self._exec("COMMAND", "INFO", "RL.GCRA")
                            found = command_exists(reply)
                        except PARSE_ERRORS:
                            found = False
                        except redis.ResponseError as e:
                            # A user whose ACL admits the limiter's commands but not COMMAND
                            # gets NOPERM: try the module; an unknown command moves to the
                            # fallback (see _call).
                            if not is_no_permission(e):
                                raise
                            found = True
                        st.mode = Mode.MODULE if found else Mode.FALLBACK
            mode = st.mode
        if mode is Mode.FALLBACK and not st.library_ready:
            async with self._detect_lock:
                if not st.library_ready:
                    await self._ensure_library()
                    st.library_ready = True
        return mode

    async def _nodes(self) -> list[Any]:
        if not isinstance(self.redis, aredis.RedisCluster):
            return [None]
        nodes = list(self.redis.get_primaries())
        if not nodes:  # the cluster client learns its nodes on first use
            await self.redis.initialize()
            nodes = list(self.redis.get_primaries())
        return nodes

    async def _on(self, node: Any, *args: Arg) -> Any:
        if node is None:
            return await self._exec(*args)
        return await self._exec(*args, target_nodes=node)

    async def _ensure_library(self) -> None:
        """_ensure_library: see `Limiter._ensure_library`."""
        code = library_code()
        ours = library_version(code)
        for node in await self._nodes():
            try:
                theirs: str | None = text(await self._on(node, "FCALL_RO", "rl_version", 0))
            except redis.ResponseError as e:
                if functions_refused(e):  # Redis 6.x, or FCALL denied: run as scripts
                    self.use_scripts(e)
                    return
                if not is_missing_function(e):
                    raise
                theirs = None
            where = "" if node is None else f" on {node.name}"
            await self._load_on(node, code, ours, theirs, where)
            if self._state.scripts:
                return

    async def _load_on(self, node: Any, code: str, ours: str, theirs: str | None, where: str) -> None:
        """_load_on loads our library on one node where library_action says so. A library
        that is missing is loaded without REPLACE, so one that another client loaded since
        we looked (maybe a newer one, in a rolling deploy) is never overwritten: it is
        looked at again, and replaced only if it is older."""
        for _ in (0, 1):
            plan = self.library_action(theirs, ours, where)
            if plan is None:
                return
            load = code
            if plan is LibraryPlan.REPLACE:
                try:
                    load = configured_code(code, parse_config(await self._on(node, "FCALL_RO", "rl_config", 0)))
                except redis.ResponseError:
                    pass  # a library too old to report its settings: ours are the defaults
            words: list[Arg] = ["FUNCTION", "LOAD", "REPLACE"] if plan is LibraryPlan.REPLACE else ["FUNCTION", "LOAD"]
            try:
                await self._on(node, *words, load)
            except redis.ResponseError as e:
                if plan is LibraryPlan.LOAD and "already exists" in str(e).lower():
                    # Another client loaded it since we looked: "" (no rl_version) is older.
                    try:
                        theirs = text(await self._on(node, "FCALL_RO", "rl_version", 0))
                    except redis.ResponseError as again:
                        if not is_missing_function(again):
                            raise
                        theirs = ""
                    continue
                if not functions_refused(e):
                    raise
                if theirs is not None:  # FUNCTION denied: the library there will do
                    self.logger.warning(
                        "redis-rl: cannot load library %s%s (%s); using the %s there", ours, where, e, theirs
                    )
                    return
                self.use_scripts(e)  # FUNCTION renamed away or denied: run as scripts
                return
            self.logger.info(
                "redis-rl: loaded redis_rl library %s%s (it had: %s)", ours, where, theirs or "none"
            )
            return

    async def _call(self, op: str, keys: list[str], args: list[Arg]) -> tuple[Any, Mode]:
        """_call: see `Limiter._call`."""
        redetected = False
        for _ in range(4):
            mode = await self._mode()
            self.counters.add("redis_calls")
            sent = time.monotonic()
            form = self._state.script_form() if mode is Mode.FALLBACK else None
            command = frame(mode, op, keys, args, form)
            route = (
                cluster_route(self.redis, command[0], keys)
                if isinstance(self.redis, aredis.RedisCluster)
                else {}
            )
            try:
                reply = await self._exec(*command, **route)
            except redis.ResponseError as e:
                if form is None and mode is Mode.FALLBACK and op in TWIN_OPS and is_oom(e):
                    # Out of memory the server refuses the writing function whole: its twin
                    # answers denials, PEEK and QUANTITY 0 (docs/clients.md#out-of-memory).
                    reply = await self._twin(op, keys, args, route, e)
                    self.observe_rtt(sent)
                    return reply, mode
                if not redetected and mode is Mode.MODULE and self.mode_setting is Mode.AUTO and is_unknown_command(e):
                    # The module is not (or no longer) there: the fallback answers.
                    redetected = True
                    self._state.mode = Mode.FALLBACK
                    continue
                if not redetected and form is None and mode is Mode.FALLBACK and is_missing_function(e):
                    redetected = True
                    self._state.library_ready = False
                    continue
                if form is None:
                    raise
                step = script_recovery(self._state, form, e)
                if step is ScriptStep.LOAD:
                    await self._script_load(route)
                if step is not None:
                    continue
                if scripting_refused(e):
                    raise self.no_scripting(e) from e
                raise
            self.observe_rtt(sent)
            if form == "eval":
                self._state.script_cached = True  # the server has the text now
            return reply, mode
        raise LimiterError(f"redis-rl: the fallback's scripts kept failing on this server ({op})")

    async def _twin(self, op: str, keys: list[str], args: list[Arg], route: dict[str, Any], oom: BaseException) -> Any:
        """_twin: see `Limiter._twin`."""
        self.counters.add("redis_calls")
        try:
            return await self._exec(*twin_frame(op, keys, args), **route)
        except redis.ResponseError as e:
            if twin_missing(e):
                raise oom from None
            raise

    async def _script_load(self, route: dict[str, Any]) -> None:
        """_script_load sends the script's text with SCRIPT LOAD to the node `route` names
        (the call's key's master; the one server), where EVAL is refused."""
        try:
            await self._exec("SCRIPT", "LOAD", script_body(), **route)
        except redis.ResponseError as e:
            if scripting_refused(e):
                raise self.no_scripting(e) from e
            raise

    async def _guarded(self, op: str, keys: list[str], args: list[Arg]) -> tuple[Any, Mode] | BaseException:
        """_guarded: see `Limiter._guarded` (a connection-level failure is tried once more on
        a fresh connection before it counts as an outage)."""
        try:
            try:
                return await self._call(op, keys, args)
            except Exception as e:
                if not is_connection_level(e):
                    raise
                await self._drop_idle_connections()
                return await self._call(op, keys, args)
        except Exception as e:
            if not is_unavailable(e):
                raise
            self.health.failure(e)
            return e

    async def _drop_idle_connections(self) -> None:
        """_drop_idle_connections: see `Limiter._drop_idle_connections`."""
        pool = getattr(self.redis, "connection_pool", None)
        if pool is not None:
            try:
                await pool.disconnect(inuse_connections=False)
            except Exception:  # closing a dead socket may fail; the retry reconnects anyway
                pass

    # -- decisions --------------------------------------------------------------------------

    async def check(
        self,
        key: str,
        limit: Limit,
        cost: int = 1,
        *,
        peek: bool = False,
        max_wait: timedelta | float | None = None,
        force: bool = False,
    ) -> Decision:
        """check: see `Limiter.check`."""
        op, args = check_command(limit, cost=cost, peek=peek, max_wait=max_wait, force=force)
        full = self.full_key(key)
        # A request larger than the limit goes to Redis, which answers NEVER (HTTP 413).
        plain = not (peek or force or max_wait is not None) and 1 <= cost <= limit.capacity
        ck: Hashable = (full, limit)
        if plain:
            # Units this limiter already paid for in Redis are its to hand out whatever the
            # deny cache says: the credit answers first (a denial one caller cached must not
            # strand another's batch).
            k = self.batch_size(limit, cost)
            if k:
                local = self.from_credit(ck, limit, full, cost)
                if local is not None:
                    return local
            local = self.local_denial(ck, cost)
            if local is not None:
                return local
            if k:
                return await self._check_batched(ck, full, limit, cost, k)
        opts: dict[str, Any] = {"cost": cost, "peek": peek, "max_wait": max_wait, "force": force}
        if self.health.skip():
            return self.degraded(limit, full, None, **opts)
        sent = time.monotonic()
        got = await self._guarded(op, [full], args)
        if isinstance(got, BaseException):
            return self.degraded(limit, full, got, **opts)
        reply, mode = got
        d = decision_from_reply(
            ints(reply), policy=limit, key=full, source=source_of(mode), reservation=max_wait is not None
        )
        if plain:
            self.remember(ck, cost, d, sent)
        return self.decided(d)

    async def _check_batched(self, ck: Hashable, full: str, limit: Limit, cost: int, k: int) -> Decision:
        if self.health.skip():
            return self.degraded(limit, full, None, cost=cost)
        want = self.first_take(ck, limit, cost, k)
        for _ in range(3):
            op, args = check_command(limit, cost=want, peek=False, max_wait=None, force=False)
            sent = time.monotonic()
            got = await self._guarded(op, [full], args)
            if isinstance(got, BaseException):
                return self.degraded(limit, full, got, cost=cost)
            reply, mode = got
            d = decision_from_reply(ints(reply), policy=limit, key=full, source=source_of(mode))
            self.note_remaining(ck, d.remaining)
            if d.allowed:
                d, old = self.keep_credit(ck, limit, full, want, cost, d, sent)
                if old is not None:
                    self._pending.append(old)
                self._ensure_sweeper()
                return self.decided(d)
            self.remember(ck, want, d, sent)
            if d.never or want == cost:
                break
            derived = self.denial_for_cost(limit, d, want, cost)
            if derived is not None:
                self.remember(ck, cost, derived, sent - 0.001)
                d = derived
                break
            want = max(cost, min(want - 1, d.remaining))
        return self.decided(d)

    async def force(self, key: str, limit: Limit, cost: int) -> Decision:
        """force: see `Limiter.force`."""
        return await self.check(key, limit, cost, force=True)

    async def check_all(
        self,
        limits: Mapping[str, LimitEntry],
        cost: int = 1,
        *,
        peek: bool = False,
        force: bool = False,
        tokens: Mapping[str, str | bytes] | None = None,
    ) -> Decision:
        """check_all: see `Limiter.check_all`."""
        items = self.all_items(limits, tokens)
        args = self.all_args(items, cost, peek, force)
        plain = not (peek or force) and all(
            (cost if own is None else own) <= lim.capacity for _, lim, own, _ in items
        )
        ck = self.all_cache_key(items, cost)
        if plain:
            local = self.local_denial(ck, cost)
            if local is not None:
                return local
        if self.health.skip():
            return self.degraded_all(items, None, cost=cost, peek=peek, force=force)
        sent = time.monotonic()
        got = await self._guarded("all", [k for k, _, _, _ in items], args)
        if isinstance(got, BaseException):
            return self.degraded_all(items, got, cost=cost, peek=peek, force=force)
        reply, mode = got
        d = self.all_decision(reply, items, mode, cost)
        if plain:
            self.remember_all(ck, items, cost, d, sent)
        return self.decided(d)

    async def refund(self, key: str, n: int = 1) -> Refund:
        """refund: see `Limiter.refund` (under "local", memory's charges go back there)."""
        full = self.full_key(key)
        positive(n, "quantity")
        if self.deny_cache is not None:
            self.deny_cache.forget(full)
        local, n = self.refund_owed(full, n)
        if n == 0:
            assert local is not None
            return local
        # Inside an outage's probe interval it answers at once, like a check.
        got = None if self.health.skip() else await self._guarded("refund", [full], [n])
        if got is None or isinstance(got, BaseException):
            return self.with_owed(local, self.degraded_refund(full, n, got))
        self.health.success()
        r = ints(got[0])
        self.counters.add("refunded", r[0])
        return self.with_owed(local, Refund(r[0], r[1], ms_to_timedelta(r[2])))

    async def refund_decision(self, decision: Decision, n: int = 1) -> Refund:
        """refund_decision: see `Limiter.refund_decision` (the charge goes back where
        `decision` took it)."""
        r = self.decision_refund(decision, n)
        if r is not None:
            return r
        assert decision.key is not None
        got = None if self.health.skip() else await self._guarded("refund", [decision.key], [n])
        if got is None or isinstance(got, BaseException):
            return self.lost_refund(decision.key, got)
        self.health.success()
        v = ints(got[0])
        self.counters.add("refunded", v[0])
        return Refund(v[0], v[1], ms_to_timedelta(v[2]))

    # -- leases -------------------------------------------------------------------------------

    def acquire(
        self,
        key: str,
        lease: Lease,
        token: str | bytes | None = None,
        *,
        slots: int = 1,
        on_lost: Callable[[AsyncHeld], Any] | None = None,
    ) -> _Acquire:
        """acquire: see `Limiter.acquire`; use `async with limiter.acquire(...) as held:`
        or `held = await limiter.acquire(...)`. `on_lost(held)` may be a plain function or
        a coroutine function (then it runs as a task of the running loop); leaving the
        `async with` block of a lost lease raises LeaseLost."""
        if not isinstance(lease, Lease):
            raise TypeError("acquire() takes a Lease")
        positive(slots, "QUANTITY")
        tok = check_token(token if token is not None else uuid.uuid4().hex)
        return _Acquire(self, self.full_key(key), lease, tok, slots, on_lost, generated=token is None)

    async def _lease_call(self, full: str, lease: Lease, tok: bytes, slots: int, *, peek: bool = False) -> Decision:
        args = self.lease_args(lease, tok, slots, peek)
        if self.health.skip():
            return self.degraded_lease(lease, full, tok, slots, peek, None)
        got = await self._guarded("lease", [full], args)
        if isinstance(got, BaseException):
            return self.degraded_lease(lease, full, tok, slots, peek, got)
        reply, mode = got
        return self.decided(decision_from_reply(ints(reply), policy=lease, key=full, source=source_of(mode)))

    async def _renew_call(self, full: str, lease: Lease, tok: bytes, slots: int) -> Decision | None:
        """_renew_call: see `Limiter._renew_call`."""
        if self.health.skip():
            return None
        for renew in (self._state.renew is not False, False):
            try:
                got = await self._guarded("lease", [full], self.lease_args(lease, tok, slots, renew=renew))
            except redis.ResponseError as e:
                if renew and is_unknown_renew(e):
                    self._state.renew = False
                    continue
                self.health.success()  # Redis answered (LEASELOST, or another refusal)
                raise
            if isinstance(got, BaseException):
                return None
            self.health.success()
            reply, mode = got
            return decision_from_reply(ints(reply), policy=lease, key=full, source=source_of(mode))
        return None  # pragma: no cover

    async def release(self, key: str, token: str | bytes) -> Release:
        """release: see `Limiter.release` (also frees a lease memory granted in an outage)."""
        full, tok = self.full_key(key), check_token(token)
        return self.release_in_memory(full, tok, await self._release(full, tok))

    async def _release(self, full: str, tok: bytes) -> Release:
        # Inside an outage's probe interval it answers at once, like a check.
        got = None if self.health.skip() else await self._guarded("release", [full], [tok])
        if got is None or isinstance(got, BaseException):
            return self.degraded_release(full, tok, got)
        self.health.success()
        r = ints(got[0])
        return Release(r[0], r[1], ms_to_timedelta(r[2]))

    # -- batch refunds ------------------------------------------------------------------------

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.batch_hold / 2)
            await self.refund_leftovers()

    async def refund_leftovers(self, *, everything: bool = False) -> int:
        """refund_leftovers: see `Limiter.refund_leftovers`."""
        if self.credits is None:
            return 0
        todo = self.credits.drain() if everything else self.credits.expired(time.monotonic())
        todo += self._pending
        self._pending = []
        total = 0
        for c in todo:
            if time.monotonic() >= c.refund_until:
                continue
            self.counters.add("refunded", c.units)  # before the write: see Limiter
            try:
                r = ints((await self._call("refund", [c.key], [c.units]))[0])
            except Exception as e:
                if not is_unavailable(e):
                    self.logger.warning("redis-rl: refund of batch leftovers failed: %s", e)
                continue
            total += r[0]
        return total

    async def aclose(self) -> None:
        """aclose refunds held batch units and stops the background refunds."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
            self._sweeper = None
        await self.refund_leftovers(everything=True)

    async def __aenter__(self) -> AsyncLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Acquire:
    """_Acquire is what AsyncLimiter.acquire returns: awaitable, or an async context manager."""

    #: Releases of slots taken by acquires cancelled in flight, kept until they end.
    _abandoned: set[asyncio.Task[Any]] = set()

    def __init__(
        self, limiter: AsyncLimiter, key: str, lease: Lease, token: bytes, slots: int,
        on_lost: Callable[[AsyncHeld], Any] | None = None, *, generated: bool = False,
    ) -> None:
        self._args = (limiter, key, lease, token, slots)
        self._on_lost = on_lost
        self._generated = generated
        self._held: AsyncHeld | None = None

    async def _take(self) -> AsyncHeld:
        limiter, key, lease, token, slots = self._args
        sent = time.monotonic()
        # The call runs as its own task, shielded: when the caller is cancelled while RL.LEASE
        # is in flight, the cancellation reaches the caller at once, the call goes on, and a
        # slot it still grants under a token this package generated is released when its
        # reply arrives (nobody else has that token: the slot would stay held until the lease
        # ran out). A token the caller chose is the caller's to release (`release`): it may
        # already hold a lease that this call only renewed.
        call = asyncio.ensure_future(limiter._lease_call(key, lease, token, slots))
        try:
            d = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(self._release_abandoned)
            raise
        if not d.allowed:
            raise RateLimitExceeded(d)
        held = AsyncHeld(limiter, key, lease, token, slots, d, sent, on_lost=self._on_lost)
        held._start()
        return held

    def _release_abandoned(self, call: asyncio.Future[Decision]) -> None:
        # call.exception() also marks an error nobody awaited as seen.
        if call.cancelled() or call.exception() is not None or not self._generated or not call.result().allowed:
            return
        limiter, key, lease, token, slots = self._args
        held = AsyncHeld(limiter, key, lease, token, slots, call.result())

        async def release() -> None:
            try:
                await held.release()
            except Exception:  # a failed release only under-admits: the slot lapses with its lease
                pass

        task = asyncio.ensure_future(release())
        _Acquire._abandoned.add(task)
        task.add_done_callback(_Acquire._abandoned.discard)

    def __await__(self) -> Generator[Any, None, AsyncHeld]:
        return self._take().__await__()

    async def __aenter__(self) -> AsyncHeld:
        self._held = await self._take()
        return self._held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._held is not None:
            await self._held.__aexit__(exc_type, exc, tb)


class AsyncHeld(HeldBase):
    """AsyncHeld is a lease taken by `AsyncLimiter.acquire`: renewed by a background task
    (every third of the lease, with `RENEW`), released on exit. See HeldBase for `decision`,
    `lost` and `on_lost`; leaving the `async with` block of a lost lease raises LeaseLost."""

    def __init__(
        self, limiter: AsyncLimiter, key: str, lease: Lease, token: bytes, slots: int, decision: Decision,
        since: float | None = None, *, on_lost: Callable[[AsyncHeld], Any] | None = None,
    ) -> None:
        super().__init__(
            limiter, key, lease, token, slots, decision,
            time.monotonic() if since is None else since, on_lost,
        )
        self.limiter = limiter
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._hook_tasks: set[asyncio.Task[Any]] = set()

    def call_hook(self) -> None:
        assert self.on_lost is not None
        result = self.on_lost(self)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._hook_tasks.add(task)
            task.add_done_callback(self._hook_tasks.discard)

    def _start(self) -> None:
        if not self.holds_nothing:
            self._stop = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._renew_loop(self._stop))

    async def _renew_loop(self, stop: asyncio.Event) -> None:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), self.renew_every)
                return  # released
            except asyncio.TimeoutError:
                pass
            try:
                await self.renew()
            except Exception as e:  # Redis refused the renewal (LEASELOST; not an outage): stop
                self.note_error(e)
                return

    async def renew(self) -> Decision | None:
        """renew extends the lease to a full lease time from now (with `RENEW`); returns
        Redis's decision, or None when Redis did not answer. Raises redis.ResponseError
        `LEASELOST …` when Redis no longer holds it."""
        self.lost  # noqa: B018 - applies the "not renewed for a whole lease time" rule first
        sent = time.monotonic()
        if self.decision.degraded:  # taken by the failure policy "local": renewed in memory
            d: Decision | None = self.limiter.renew_locally(self.key, self.lease, self.token, self.slots)
        else:
            d = await self.limiter._renew_call(self.key, self.lease, self.token, self.slots)
        self.note_renewal(d, sent)
        return d

    async def release(self) -> Release | None:
        """release frees the slots now (idempotent); never raises LeaseLost (the block does).

        The renewal task is told to stop, and given the time of one renewal call to finish
        it; it is not cancelled in the middle of a call (a command cut off by a
        cancellation can cost a connection, and some client code paths turn it into a
        connection error), only cancelled if it does not stop within a second.
        """
        task = self._task
        if self._stop is not None:
            self._stop.set()
        if task is not None and task is not asyncio.current_task() and not task.done():
            await asyncio.wait({task}, timeout=1.0)
            if not task.done():
                task.cancel()
        if self._released or self.holds_nothing or self._gone:
            self._released = True
            return None
        self._released = True
        if self.decision.degraded and self.limiter.memory is not None:
            return self.limiter.degraded_release(self.key, self.token, None)
        return await self.limiter._release(self.key, self.token)

    async def __aenter__(self) -> AsyncHeld:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = self.lost
        await self.release()
        if lost and exc is None:
            raise self.lost_error()
