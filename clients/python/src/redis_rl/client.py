"""The synchronous limiter, over `redis.Redis` or `redis.RedisCluster`."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Hashable, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._base import HeldBase, LimiterBase, LimitEntry, Refund, Release, duration_seconds
from ._decision import Decision, decision_from_reply, ms_to_timedelta
from ._limits import Lease, Limit, check_token, positive
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

__all__ = ["Held", "Limiter"]


class Limiter(LimiterBase):
    """Limiter makes rate-limit decisions in Redis (sync).

    `Limiter(redis.Redis(...))` or `Limiter(redis.RedisCluster(...))`, or
    `Limiter.from_url("redis://host:6379/0", timeout=0.5)` which builds a client with the
    connect/command timeout and without redis-py's retries (a retried limiter call can be
    counted twice, and retries make an outage slow to detect).

    Options (all keyword):
      mode: "auto" (detect the module once per connection pool), "module" or "fallback"
        (the Lua Functions library, loaded with FUNCTION LOAD when missing and
        `load_library` is true).
      on_error: "open" | "closed" | "raise" | "local" — see FailurePolicy.
      fleet_size: under "local", the number of processes sharing the limits (an int ≥ 1,
        default 1; ValueError otherwise): each limit is divided by it while Redis is away.
      prefix: prepended to every key (no braces: hash tags belong to the caller's keys).
      deny_cache: answer denied keys locally until their retry_after (default on).
      batch: take up to this many units per Redis call and admit locally from them
        (GCRA, FIXED and SLIDING limits; default off); `batch_hold`: how long unused units
        are held before being refunded (default 0.1 s).
      probe_interval: during an outage, how often a call tries Redis again (default 1 s);
        the others are answered by the policy at once.
      closed_retry_after: the retry_after of a "closed" denial (default 1 s).
        Duration settings (and `from_url`'s `timeout`) must be > 0 and at most
        MAX_SECONDS (ten years), else ValueError.
      hook: called as hook(counter_name, n) on every counter increment.
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster, **options: Any) -> None:
        super().__init__(client, **options)
        self._state = pool_state(client)
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        self._pending: list[Credit] = []
        self._pending_lock = threading.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: timedelta | float = 0.5,
        cluster: bool = False,
        **options: Any,
    ) -> Limiter:
        """from_url builds the redis client (timeouts set, no retries) and the limiter."""
        t = duration_seconds(timeout, "timeout")
        kwargs: dict[str, Any] = {
            "socket_timeout": t,
            "socket_connect_timeout": t,
            "retry": Retry(NoBackoff(), 0),
        }
        client: redis.Redis | redis.RedisCluster
        if cluster:
            client = redis.RedisCluster.from_url(url, **kwargs)
        else:
            client = redis.Redis.from_url(url, **kwargs)
        return cls(client, **options)

    # -- mode and the fallback library ----------------------------------------------------

    @property
    def mode(self) -> Mode:
        """mode is the resolved mode (MODULE or FALLBACK), detecting it if needed."""
        return self._mode()

    def _mode(self) -> Mode:
        st = self._state
        mode: Mode
        if self.mode_setting is not Mode.AUTO:
            mode = self.mode_setting
        else:
            if st.mode is None:
                with st.lock:
                    if st.mode is None:
                        try:
                            reply = self.redis.execute_command("COMMAND", "INFO", "RL.GCRA")
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
            with st.lock:
                if not st.library_ready:
                    self._ensure_library()
                    st.library_ready = True
        return mode

    def _nodes(self) -> list[Any]:
        if isinstance(self.redis, redis.RedisCluster):
            return list(self.redis.get_primaries())  # type: ignore[no-untyped-call]
        return [None]

    def _on(self, node: Any, *args: Arg) -> Any:
        if node is None:
            return self.redis.execute_command(*args)
        return self.redis.execute_command(*args, target_nodes=node)

    def _ensure_library(self) -> None:
        """_ensure_library makes every master run our library version: loads it where it is
        missing and replaces an older one (keeping the server's settings), per `rl_version`."""
        code = library_code()
        ours = library_version(code)
        for node in self._nodes():
            try:
                theirs: str | None = text(self._on(node, "FCALL_RO", "rl_version", 0))
            except redis.ResponseError as e:
                if functions_refused(e):  # Redis 6.x, or FCALL denied: run as scripts
                    self.use_scripts(e)
                    return
                if not is_missing_function(e):
                    raise
                theirs = None
            where = "" if node is None else f" on {node.name}"
            self._load_on(node, code, ours, theirs, where)
            if self._state.scripts:
                return

    def _load_on(self, node: Any, code: str, ours: str, theirs: str | None, where: str) -> None:
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
                    load = configured_code(code, parse_config(self._on(node, "FCALL_RO", "rl_config", 0)))
                except redis.ResponseError:
                    pass  # a library too old to report its settings: ours are the defaults
            words: list[Arg] = ["FUNCTION", "LOAD", "REPLACE"] if plan is LibraryPlan.REPLACE else ["FUNCTION", "LOAD"]
            try:
                self._on(node, *words, load)
            except redis.ResponseError as e:
                if plan is LibraryPlan.LOAD and "already exists" in str(e).lower():
                    # Another client loaded it since we looked: "" (no rl_version) is older.
                    try:
                        theirs = text(self._on(node, "FCALL_RO", "rl_version", 0))
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

    def _call(self, op: str, keys: list[str], args: list[Arg]) -> tuple[Any, Mode]:
        """_call runs one command in the resolved mode, re-detecting once when the module
        disappeared or the library was flushed (a restart, a failover), and, as scripts,
        going on as script_recovery says (NOSCRIPT on a node, EVAL or EVALSHA refused)."""
        redetected = False
        for _ in range(4):
            mode = self._mode()
            self.counters.add("redis_calls")
            sent = time.monotonic()
            form = self._state.script_form() if mode is Mode.FALLBACK else None
            command = frame(mode, op, keys, args, form)
            route = (
                cluster_route(self.redis, command[0], keys)
                if isinstance(self.redis, redis.RedisCluster)
                else {}
            )
            try:
                reply = self.redis.execute_command(*command, **route)
            except redis.ResponseError as e:
                if form is None and mode is Mode.FALLBACK and op in TWIN_OPS and is_oom(e):
                    # Out of memory the server refuses the writing function whole: its twin
                    # answers denials, PEEK and QUANTITY 0 (docs/clients.md#out-of-memory).
                    reply = self._twin(op, keys, args, route, e)
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
                    self._script_load(route)
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

    def _twin(self, op: str, keys: list[str], args: list[Arg], route: dict[str, Any], oom: BaseException) -> Any:
        """_twin asks the library's no-writes twin (`FCALL_RO rl_<op>_ro`, the same keys and
        arguments, the same node) once, after the server refused `FCALL rl_<op>` for memory:
        its answer (a denial, a peek, an error, or OOM where the call would write) is the
        call's. A library older than 1.3.0 has no twin: the OOM error stands."""
        self.counters.add("redis_calls")
        try:
            return self.redis.execute_command(*twin_frame(op, keys, args), **route)
        except redis.ResponseError as e:
            if twin_missing(e):
                raise oom from None
            raise

    def _script_load(self, route: dict[str, Any]) -> None:
        """_script_load sends the script's text with SCRIPT LOAD to the node `route` names
        (the call's key's master; the one server), where EVAL is refused."""
        try:
            self.redis.execute_command("SCRIPT", "LOAD", script_body(), **route)
        except redis.ResponseError as e:
            if scripting_refused(e):
                raise self.no_scripting(e) from e
            raise

    def _guarded(self, op: str, keys: list[str], args: list[Arg]) -> tuple[Any, Mode] | BaseException:
        """_guarded returns (reply, mode), or the outage error (after counting it).

        A connection-level failure (`is_connection_level`: a pooled connection that a Redis
        restart closed) is tried once more on a fresh connection before it counts as an
        outage, so the first call after a restart the limiter did not see is
        decided by Redis (docs/clients.md#recovery)."""
        try:
            try:
                return self._call(op, keys, args)
            except Exception as e:
                if not is_connection_level(e):
                    raise
                self._drop_idle_connections()
                return self._call(op, keys, args)
        except Exception as e:
            if not is_unavailable(e):
                raise
            self.health.failure(e)
            return e

    def _drop_idle_connections(self) -> None:
        """_drop_idle_connections closes the pool's idle connections (a restart closed them
        all on the server's side): the next call connects afresh. A cluster client replaces
        a failed node's connections itself."""
        pool = getattr(self.redis, "connection_pool", None)
        if pool is not None:
            try:
                pool.disconnect(inuse_connections=False)
            except Exception:  # closing a dead socket may fail; the retry reconnects anyway
                pass

    # -- decisions --------------------------------------------------------------------------

    def check(
        self,
        key: str,
        limit: Limit,
        cost: int = 1,
        *,
        peek: bool = False,
        max_wait: timedelta | float | None = None,
        force: bool = False,
    ) -> Decision:
        """check asks whether `cost` units of `limit` on `key` may go ahead now, and takes them.

        `peek`: evaluate without taking (dry run). `max_wait` (GCRA): a reservation — admit
        a request that would be allowed within max_wait, with `retry_after` the wait before
        acting. `force`: record usage that already happened, allowed or not (not for LOG).
        """
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
                return self._check_batched(ck, full, limit, cost, k)
        opts: dict[str, Any] = {"cost": cost, "peek": peek, "max_wait": max_wait, "force": force}
        if self.health.skip():
            return self.degraded(limit, full, None, **opts)
        sent = time.monotonic()
        got = self._guarded(op, [full], args)
        if isinstance(got, BaseException):
            return self.degraded(limit, full, got, **opts)
        reply, mode = got
        d = decision_from_reply(
            ints(reply), policy=limit, key=full, source=source_of(mode), reservation=max_wait is not None
        )
        if plain:
            self.remember(ck, cost, d, sent)
        return self.decided(d)

    def _check_batched(self, ck: Hashable, full: str, limit: Limit, cost: int, k: int) -> Decision:
        if self.health.skip():
            return self.degraded(limit, full, None, cost=cost)
        want = self.first_take(ck, limit, cost, k)
        for _ in range(3):
            op, args = check_command(limit, cost=want, peek=False, max_wait=None, force=False)
            sent = time.monotonic()
            got = self._guarded(op, [full], args)
            if isinstance(got, BaseException):
                return self.degraded(limit, full, got, cost=cost)
            reply, mode = got
            d = decision_from_reply(ints(reply), policy=limit, key=full, source=source_of(mode))
            self.note_remaining(ck, d.remaining)
            if d.allowed:
                d, old = self.keep_credit(ck, limit, full, want, cost, d, sent)
                if old is not None:
                    self._queue_refund(old)
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

    def force(self, key: str, limit: Limit, cost: int) -> Decision:
        """force records `cost` units of usage that already happened (RL.* … FORCE)."""
        return self.check(key, limit, cost, force=True)

    def check_all(
        self,
        limits: Mapping[str, LimitEntry],
        cost: int = 1,
        *,
        peek: bool = False,
        force: bool = False,
        tokens: Mapping[str, str | bytes] | None = None,
    ) -> Decision:
        """check_all decides one request against several limits atomically (RL.ALL).

        `limits` maps keys to limits, or to (limit, cost) for a per-limit cost (e.g. one
        request and 1,200 tokens). Every limit admits it and all are charged, or none is.
        The combined decision has the per-key ones in `per_key`. On a cluster, give the
        keys one hash tag: `{user42}:rpm`, `{user42}:tpm`.
        """
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
        got = self._guarded("all", [k for k, _, _, _ in items], args)
        if isinstance(got, BaseException):
            return self.degraded_all(items, got, cost=cost, peek=peek, force=force)
        reply, mode = got
        d = self.all_decision(reply, items, mode, cost)
        if plain:
            self.remember_all(ck, items, cost, d, sent)
        return self.decided(d)

    def refund(self, key: str, n: int = 1) -> Refund:
        """refund gives back up to `n` units to `key` (RL.REFUND); see Refund.

        Under the failure policy "local" a refund goes back where the charge was taken: the
        units the in-memory limiter charged `key` during an outage and has not given back are
        given back there first, also once Redis answers again (Redis never had them), and
        only the rest of `n` goes to Redis. Memory remembers them while it holds the key
        (until the key is idle). `refund_decision` gives back one decision's charge exactly
        where it was taken."""
        full = self.full_key(key)
        positive(n, "quantity")
        if self.deny_cache is not None:
            self.deny_cache.forget(full)
        local, n = self.refund_owed(full, n)
        if n == 0:
            assert local is not None
            return local
        # Inside an outage's probe interval it answers at once, like a check.
        got = None if self.health.skip() else self._guarded("refund", [full], [n])
        if got is None or isinstance(got, BaseException):
            return self.with_owed(local, self.degraded_refund(full, n, got))  # raises for RAISE
        self.health.success()
        r = ints(got[0])
        self.counters.add("refunded", r[0])
        return self.with_owed(local, Refund(r[0], r[1], ms_to_timedelta(r[2])))

    def refund_decision(self, decision: Decision, n: int = 1) -> Refund:
        """refund_decision gives back up to `n` units of the charge `decision` took, where it
        took it: to the in-memory limiter when it is the failure policy "local"'s decision
        (degraded, not blind), also once Redis answers again; nothing when it is blind (the
        policy "open" or "closed" charged nothing); else to Redis (RL.REFUND), and when Redis
        does not answer the refund is lost (it only under-admits), never taken from memory
        (LimiterUnavailable under "raise"). Forgets the local denials of its key.

        `decision` is one key's decision this limiter returned (`check`, `force`, or one of a
        `check_all`'s `per_key`): a combined decision or one without a key is a ValueError, a
        lease's a TypeError (release it). `n` must be at least 1.
        """
        r = self.decision_refund(decision, n)
        if r is not None:
            return r
        assert decision.key is not None
        got = None if self.health.skip() else self._guarded("refund", [decision.key], [n])
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
        on_lost: Callable[[Held], Any] | None = None,
    ) -> Held:
        """acquire takes `slots` (≥ 1) of the concurrency limit `lease` on `key` (RL.LEASE).

        Returns a Held, a context manager that renews the lease in the background while held
        (`RL.LEASE … RENEW` every third of the lease) and releases it on exit. Raises
        RateLimitExceeded when no slot is free (its `decision` says when one may be). A
        retried acquire with the same token (1 to 64 bytes; default a random one) renews
        rather than taking a second lease.

        `on_lost(held)` is called once, from the renewal thread, if the lease is found lost
        (see Held); leaving the `with` block of a lost lease raises LeaseLost.
        """
        if not isinstance(lease, Lease):
            raise TypeError("acquire() takes a Lease")
        positive(slots, "QUANTITY")
        tok = check_token(token if token is not None else uuid.uuid4().hex)
        full = self.full_key(key)
        sent = time.monotonic()
        d = self._lease_call(full, lease, tok, slots)
        if not d.allowed:
            raise RateLimitExceeded(d)
        return Held(self, full, lease, tok, slots, d, sent, on_lost=on_lost)

    def _lease_call(self, full: str, lease: Lease, tok: bytes, slots: int, *, peek: bool = False) -> Decision:
        args = self.lease_args(lease, tok, slots, peek)
        if self.health.skip():
            return self.degraded_lease(lease, full, tok, slots, peek, None)
        got = self._guarded("lease", [full], args)
        if isinstance(got, BaseException):
            return self.degraded_lease(lease, full, tok, slots, peek, got)
        reply, mode = got
        return self.decided(decision_from_reply(ints(reply), policy=lease, key=full, source=source_of(mode)))

    def _renew_call(self, full: str, lease: Lease, tok: bytes, slots: int) -> Decision | None:
        """_renew_call is one renewal of a held lease (`RENEW`): Redis's decision, or None
        when Redis did not answer. Not a decision for the application: no failure policy, no
        counters but redis_calls and errors. Raises redis.ResponseError `LEASELOST …` when
        Redis no longer holds the lease. A server without `RENEW` (an older module or
        library) is renewed without it, once it has said so."""
        if self.health.skip():
            return None
        for renew in (self._state.renew is not False, False):
            try:
                got = self._guarded("lease", [full], self.lease_args(lease, tok, slots, renew=renew))
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

    def release(self, key: str, token: str | bytes) -> Release:
        """release frees the lease `token` holds on `key` (RL.RELEASE); harmless twice. Under
        the failure policy "local" a lease the in-memory limiter granted during an outage is
        freed there too, also once Redis answers again (`released` counts both)."""
        full, tok = self.full_key(key), check_token(token)
        return self.release_in_memory(full, tok, self._release(full, tok))

    def _release(self, full: str, tok: bytes) -> Release:
        # Inside an outage's probe interval it answers at once, like a check.
        got = None if self.health.skip() else self._guarded("release", [full], [tok])
        if got is None or isinstance(got, BaseException):
            return self.degraded_release(full, tok, got)
        self.health.success()
        r = ints(got[0])
        return Release(r[0], r[1], ms_to_timedelta(r[2]))

    # -- batch refunds ------------------------------------------------------------------------

    def _queue_refund(self, credit: Credit) -> None:
        with self._pending_lock:
            self._pending.append(credit)

    def _ensure_sweeper(self) -> None:
        if self._sweeper is not None or self.credits is None:
            return
        with self._pending_lock:
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=self._sweep_loop, name="redis-rl-refunds", daemon=True
                )
                self._sweeper.start()

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.batch_hold / 2):
            self.refund_leftovers()

    def refund_leftovers(self, *, everything: bool = False) -> int:
        """refund_leftovers gives back batch units whose hold has passed (all with
        `everything`), where that is still safe; returns the units refunded."""
        if self.credits is None:
            return 0
        now = time.monotonic()
        todo = self.credits.drain() if everything else self.credits.expired(now)
        with self._pending_lock:
            todo += self._pending
            self._pending = []
        total = 0
        for c in todo:
            if time.monotonic() >= c.refund_until:
                continue  # the window rolled over / the bucket may have drained: let it lapse
            # Counted before the write: a reader who sees the units back in Redis sees them
            # counted too (the counter never lags what Redis shows).
            self.counters.add("refunded", c.units)
            try:
                r = ints(self._call("refund", [c.key], [c.units])[0])
            except Exception as e:  # a lost refund only under-admits
                if not is_unavailable(e):
                    self.logger.warning("redis-rl: refund of batch leftovers failed: %s", e)
                continue
            total += r[0]
        return total

    def close(self) -> None:
        """close refunds held batch units and stops the background refunds."""
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=2)
        self.refund_leftovers(everything=True)

    def __enter__(self) -> Limiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Held(HeldBase):
    """Held is a lease taken by `Limiter.acquire`: renewed in the background (a daemon thread,
    every third of the lease, with `RENEW`), released on exit. See HeldBase for `decision`,
    `lost` and `on_lost`; leaving the `with` block of a lost lease raises LeaseLost."""

    def __init__(
        self, limiter: Limiter, key: str, lease: Lease, token: bytes, slots: int, decision: Decision,
        since: float | None = None, *, on_lost: Callable[[Held], Any] | None = None,
    ) -> None:
        super().__init__(
            limiter, key, lease, token, slots, decision,
            time.monotonic() if since is None else since, on_lost,
        )
        self.limiter = limiter
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.holds_nothing:
            self._thread = threading.Thread(target=self._renew_loop, name="redis-rl-lease", daemon=True)
            self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            try:
                self.renew()
            except Exception as e:  # Redis refused the renewal (LEASELOST; not an outage): stop
                self.note_error(e)
                return

    def renew(self) -> Decision | None:
        """renew extends the lease to a full lease time from now (RL.LEASE … RENEW with our
        token); returns Redis's decision, or None when Redis did not answer. Raises
        redis.ResponseError `LEASELOST …` when Redis no longer holds it."""
        self.lost  # noqa: B018 - applies the "not renewed for a whole lease time" rule first
        sent = time.monotonic()
        if self.decision.degraded:  # taken by the failure policy "local": renewed in memory
            d: Decision | None = self.limiter.renew_locally(self.key, self.lease, self.token, self.slots)
        else:
            d = self.limiter._renew_call(self.key, self.lease, self.token, self.slots)
        self.note_renewal(d, sent)
        return d

    def release(self) -> Release | None:
        """release frees the slots now (idempotent); never raises LeaseLost (the `with`
        block does)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._released or self.holds_nothing or self._gone:
            self._released = True
            return None
        self._released = True
        if self.decision.degraded and self.limiter.memory is not None:
            return self.limiter.degraded_release(self.key, self.token, None)
        return self.limiter._release(self.key, self.token)

    def __enter__(self) -> Held:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = self.lost
        self.release()
        if lost and exc is None:
            raise self.lost_error()
