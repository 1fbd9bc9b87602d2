"""What the sync and the asyncio limiter share: configuration and the I/O-free steps."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Union

from ._decision import Decision, Source, decision_from_reply, ms_to_timedelta
from ._limits import (
    GCRA,
    MAX_SECONDS,
    Algorithm,
    Lease,
    Limit,
    Window,
    check_token,
    non_negative,
    positive,
    scaled,
)
from ._local import Credit, Credits, DenyCache, batchable, credit_deadlines
from ._memory import MemoryStore
from ._policy import Counters, FailurePolicy, Health, LeaseLost, LimiterError
from ._protocol import (
    Arg,
    LibraryPlan,
    Mode,
    PoolState,
    all_command,
    ints,
    library_plan,
    max_wait_ms,
    source_of,
)

__all__ = ["HeldBase", "Refund", "Release"]

log = logging.getLogger("redis_rl")

#: A check_all entry: a limit, or (limit, its own cost).
LimitEntry = Union[Limit, tuple[Limit, int]]


@dataclass(frozen=True)
class Refund:
    """Refund is RL.REFUND's reply: units given back, the key's remaining and reset time.

    `refunded` counts the units given back wherever they went. `degraded`: Redis gave
    nothing back, either because it did not answer, or because under the failure policy
    "local" the whole refund went back to the in-memory limiter that took the charge (the
    figures are then memory's)."""

    refunded: int
    remaining: int
    reset_after: timedelta
    degraded: bool = False


@dataclass(frozen=True)
class Release:
    """Release is RL.RELEASE's reply: slots freed, the key's remaining and reset time."""

    released: int
    remaining: int
    reset_after: timedelta
    degraded: bool = False


#: A lease's lost-hook: called once with the handle when it is found lost.
OnLost = Callable[[Any], Any]


class HeldBase:
    """HeldBase is what a held lease (sync Held, AsyncHeld) knows about its renewals
    (docs/clients.md#leases-that-know-they-are-lost).

    `decision` is the acquire's Decision. `lost` becomes True, and stays True, when the lease
    may no longer be held: a renewal (sent with `RENEW`) answered `LEASELOST` (the lease had
    ended, so Redis may have given its slots to another holder), a renewal was denied or
    refused with an error, or no renewal reached Redis for a whole lease time. Then
    `on_lost(handle)` is called once (from the renewal thread or task, or from whoever reads
    `lost` first), the counter `leases_lost` is bumped, and leaving the `with` block raises
    `LeaseLost` (unless the block raised already). A lease taken by the failure policy "open"
    holds nothing and is never lost; one taken by the policy "local" is renewed in memory.
    """

    def __init__(
        self, limiter: LimiterBase, key: str, lease: Lease, token: bytes, slots: int, decision: Decision,
        since: float, on_lost: OnLost | None = None,
    ) -> None:
        self.key = key
        self.lease = lease
        self.token = token
        self.slots = slots
        self.decision = decision
        self.on_lost = on_lost
        self._lost = False
        self._lost_reason = ""
        self._limiter_base = limiter
        self._logger = limiter.logger
        self._released = False
        self._gone = False  # Redis answered LEASELOST: it holds nothing of ours
        self._renewed_at = since  # when the last granted (re)take was sent

    @property
    def holds_nothing(self) -> bool:
        """holds_nothing: a lease the failure policy "open" granted (nothing to renew)."""
        return self.decision.blind

    @property
    def lost(self) -> bool:
        """lost: the lease may no longer be held (see the class). Reading it also applies the
        "not renewed for a whole lease time" rule, so a holder whose renewals are stuck learns
        it without waiting for them."""
        if not self._lost and not self._released and not self.holds_nothing:
            if time.monotonic() - self._renewed_at >= self.lease.lease_ns / 1e9:
                self.mark_lost("no renewal reached Redis for a whole lease time: it may be lost")
        return self._lost

    @property
    def renew_every(self) -> float:
        """renew_every is the renewal period in seconds: a third of the lease."""
        return self.lease.lease_ns / 1e9 / 3

    def mark_lost(self, reason: str) -> bool:
        """mark_lost records that the lease is lost (once): logs, counts, calls on_lost.
        Returns True the first time."""
        if self._lost:
            return False
        self._lost = True
        self._lost_reason = reason
        self._limiter_base.counters.add("leases_lost")
        self._logger.warning("redis-rl: lease on %r lost: %s", self.key, reason)
        if self.on_lost is not None:
            try:
                self.call_hook()
            except Exception:  # a hook's failure must not stop the renewals or the release
                self._logger.exception("redis-rl: the on_lost hook of the lease on %r failed", self.key)
        return True

    def call_hook(self) -> None:
        assert self.on_lost is not None
        self.on_lost(self)

    def note_renewal(self, d: Decision | None, sent: float) -> None:
        """note_renewal records one renewal: its decision, or None when Redis did not answer."""
        if d is None:
            if time.monotonic() - self._renewed_at >= self.lease.lease_ns / 1e9:
                self.mark_lost("no renewal reached Redis for a whole lease time: it may be lost")
        elif d.allowed:
            self._renewed_at = sent
        else:
            self.mark_lost("a renewal was denied (the limit is below what is held)")

    def note_error(self, exc: BaseException) -> None:
        """note_error records a renewal that Redis refused with an error (LEASELOST among
        them); renewals stop."""
        if str(exc).startswith("LEASELOST"):
            self._gone = True  # nothing to release
            said = f"Redis says it is no longer held ({exc})"
            if not self.mark_lost(said):  # found lost before: Redis confirms it
                self._lost_reason += f"; then {said}"
        else:
            self.mark_lost(f"renewing it failed: {exc}")

    def lost_error(self) -> LeaseLost:
        """lost_error is the LeaseLost raised when the block of a lost lease ends."""
        return LeaseLost(self.key, self.token, self._lost_reason)


def duration_seconds(value: timedelta | float, name: str) -> float:
    """duration_seconds reads a client-side duration setting (a timedelta or seconds) and
    checks it is positive and at most MAX_SECONDS (ten years, the module's own bound on
    durations): longer ones would overflow the platform's timers later (a thread's wait, a
    socket timeout), mid-run, so they are refused with ValueError here."""
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not 0 < s <= MAX_SECONDS:
        raise ValueError(f"{name} must be a positive duration of at most {MAX_SECONDS} s")
    return s


class LimiterBase:
    """LimiterBase holds a limiter's configuration, counters and local state."""

    def __init__(
        self,
        client: Any,
        *,
        mode: Mode | str = Mode.AUTO,
        on_error: FailurePolicy | str = FailurePolicy.OPEN,
        prefix: str = "",
        deny_cache: bool = True,
        batch: int | None = None,
        batch_hold: timedelta | float = 0.1,
        probe_interval: timedelta | float = 1.0,
        closed_retry_after: timedelta | float = 1.0,
        load_library: bool = True,
        hook: Callable[[str, int], None] | None = None,
        logger: logging.Logger | None = None,
        fleet_size: int = 1,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}' (it would become the hash tag)")
        if isinstance(fleet_size, bool) or not isinstance(fleet_size, int) or fleet_size < 1:
            raise ValueError("fleet_size must be an integer >= 1 (the number of processes)")
        self.redis = client
        self.mode_setting = Mode(mode)
        self.policy = FailurePolicy(on_error)
        self.prefix = prefix
        self.load_library = load_library
        self.logger = logger or log
        self.counters = Counters(hook)
        self.health = Health(
            self.policy,
            self.counters,
            duration_seconds(probe_interval, "probe_interval"),
            timedelta(seconds=duration_seconds(closed_retry_after, "closed_retry_after")),
            self.logger,
        )
        self.deny_cache: DenyCache | None = DenyCache() if deny_cache else None
        self.batch = positive(batch, "batch") if batch is not None else None
        self.batch_hold = duration_seconds(batch_hold, "batch_hold")
        self.credits: Credits | None = Credits() if batch is not None and batch > 1 else None
        self.fleet_size = fleet_size
        #: The in-memory limits of the failure policy "local" (None under other policies).
        self.memory: MemoryStore | None = (
            MemoryStore() if self.policy is FailurePolicy.LOCAL else None
        )
        self._scaled: dict[Limit, Limit] = {}
        self._rtt = 0.001
        self._hints: dict[Hashable, tuple[int, float]] = {}

    # -- keys ---------------------------------------------------------------------------------

    def full_key(self, key: str) -> str:
        """full_key is the key as sent: the limiter's prefix, then the caller's key."""
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        return self.prefix + key

    # -- timing -------------------------------------------------------------------------------

    def observe_rtt(self, sent: float) -> None:
        rtt = time.monotonic() - sent
        self._rtt = 0.8 * self._rtt + 0.2 * rtt

    @property
    def margin(self) -> float:
        """margin is the safety gap kept before a window boundary or GCRA refund deadline."""
        return 0.005 + 3 * self._rtt

    # -- the fallback library -------------------------------------------------------------

    def library_action(self, theirs: str | None, ours: str, where: str) -> LibraryPlan | None:
        """library_action decides, from a server's `rl_version` (None: no library), whether
        to LOAD or REPLACE the library there (None: leave it); logs or raises as needed."""
        plan = library_plan(theirs, ours)
        if plan is LibraryPlan.KEEP:
            return None
        if plan is LibraryPlan.NEWER:
            self.logger.warning(
                "redis-rl: the server%s runs redis_rl library %s, newer than ours (%s); kept",
                where, theirs, ours,
            )
            return None
        if not self.load_library:
            if plan is LibraryPlan.LOAD:
                raise LimiterError(
                    f"the redis_rl Functions library is not loaded{where} and load_library=False"
                )
            self.logger.warning(
                "redis-rl: the server%s runs redis_rl library %s, ours is %s "
                "(load_library=False: not replaced)", where, theirs, ours,
            )
            return None
        return plan

    def use_scripts(self, why: BaseException) -> None:
        """use_scripts switches this pool's fallback to scripts (EVAL, then EVALSHA): the
        server allows no Functions library (Redis 6.x, FUNCTION renamed away or denied)."""
        state: PoolState = getattr(self, "_state")
        if not state.scripts:
            state.scripts = True
            self.logger.info(
                "redis-rl: no Functions library on this server (%s): the fallback runs as scripts "
                "(EVAL, then EVALSHA)", why,
            )

    @staticmethod
    def no_scripting(exc: BaseException) -> LimiterError:
        """no_scripting is the one clear error of a server with neither the module nor any
        way to run the fallback."""
        return LimiterError(
            "redis-rl cannot decide on this server: it has no redis-rl module (RL.GCRA is not "
            "there) and refuses the Lua fallback both as a Functions library (FUNCTION/FCALL) and "
            f"as scripts (EVAL/EVALSHA): {exc}. Load the module, or allow FCALL and FUNCTION, or "
            "EVAL and EVALSHA, for this client"
        )

    # -- leases -------------------------------------------------------------------------------

    @staticmethod
    def lease_args(
        lease: Lease, token: bytes, slots: int, peek: bool = False, renew: bool = False
    ) -> list[Arg]:
        non_negative(slots, "QUANTITY")
        args: list[Arg] = [*lease.args(), token]
        if slots != 1:
            args += ["QUANTITY", slots]
        if peek:
            args.append("PEEK")
        if renew:
            args.append("RENEW")
        return args

    # -- decisions ----------------------------------------------------------------------------

    def local_denial(self, ck: Hashable, cost: int) -> Decision | None:
        if self.deny_cache is None:
            return None
        d = self.deny_cache.lookup(ck, cost, time.monotonic())
        if d is not None:
            self.counters.add("denied_locally")
            self.counters.count_decision(d)
        return d

    def remember(self, ck: Hashable, cost: int, d: Decision, sent: float) -> None:
        if self.deny_cache is not None and not d.allowed:
            self.deny_cache.store(ck, cost, d, sent)

    def remember_all(
        self,
        ck: Hashable,
        items: list[tuple[str, Limit, int | None, bytes | None]],
        cost: int,
        d: Decision,
        sent: float,
    ) -> None:
        """remember_all caches a check_all denial, unless a full lease took part in it: a
        lease's retry_after assumes no holder releases early, so it is no lower bound on when
        Redis admits again (a released slot would stay denied locally for up to the lease)."""
        for key, lim, _, _ in items:
            if isinstance(lim, Lease):
                sub = d.per_key.get(key)
                if sub is None or not sub.allowed:
                    return
        self.remember(ck, cost, d, sent)

    def degraded(
        self,
        limit: Limit,
        key: str,
        cause: BaseException | None,
        *,
        cost: int = 1,
        peek: bool = False,
        max_wait: timedelta | float | None = None,
        force: bool = False,
    ) -> Decision:
        """degraded is the failure policy's answer to a check Redis did not answer: the
        in-memory limits under "local", else open / closed (or LimiterUnavailable)."""
        if self.memory is not None:
            lim = self.local_limit(limit)
            five = self.memory.check(
                key, lim, cost, peek=peek, force=force,
                max_wait_ms=None if max_wait is None else max_wait_ms(max_wait),
            )
            d = decision_from_reply(
                five, policy=lim, key=key, source=Source.LOCAL, reservation=max_wait is not None
            )
            return self.decided_locally(replace(d, degraded=True))
        d = self.health.answer(limit, key, cause)
        self.counters.count_decision(d)
        return d

    def degraded_lease(
        self, lease: Lease, key: str, token: bytes, slots: int, peek: bool,
        cause: BaseException | None,
    ) -> Decision:
        """degraded_lease is the failure policy's answer to an acquire Redis did not answer."""
        if self.memory is not None:
            lim = self.local_limit(lease)
            assert isinstance(lim, Lease)
            five = self.memory.lease(key, lim, token, slots, peek=peek)
            d = decision_from_reply(five, policy=lim, key=key, source=Source.LOCAL)
            return self.decided_locally(replace(d, degraded=True))
        return self.degraded(lease, key, cause)

    def renew_locally(self, key: str, lease: Lease, token: bytes, slots: int) -> Decision:
        """renew_locally renews a lease the failure policy "local" granted (RENEW's rule:
        LEASELOST, a redis.ResponseError, when it is no longer held)."""
        assert self.memory is not None
        lim = self.local_limit(lease)
        assert isinstance(lim, Lease)
        five = self.memory.lease(key, lim, token, slots, renew=True)
        return replace(
            decision_from_reply(five, policy=lim, key=key, source=Source.LOCAL), degraded=True
        )

    def degraded_refund(self, key: str, n: int, cause: BaseException | None) -> Refund:
        """degraded_refund answers a refund Redis did not take: given back in memory under
        "local" (to what the local policy charged), else nothing (or LimiterUnavailable)."""
        if self.memory is not None:
            r = self.memory.refund(key, n)
            if r[0]:
                self.counters.add("refunded", r[0])
            return Refund(r[0], r[1], ms_to_timedelta(r[2]), degraded=True)
        self.health.answer(None, key, cause)  # raises for RAISE
        return Refund(0, 0, timedelta(0), degraded=True)

    def refund_owed(self, key: str, n: int) -> tuple[Refund | None, int]:
        """refund_owed gives back in memory, under "local", the part of a refund of `n` units
        of `key` that the in-memory limiter charged the key during an outage and has not
        given back (also once Redis answers again: Redis never had that charge, and a refund
        it took would give back another request's unit). Returns memory's Refund (None: it
        owed nothing) and the units left for Redis."""
        if self.memory is None:
            return None, n
        taken, r = self.memory.refund_owed(key, n, owed_only=True)
        if not taken:
            return None, n
        if r[0]:
            self.counters.add("refunded", r[0])
        return Refund(r[0], r[1], ms_to_timedelta(r[2]), degraded=True), n - taken

    @staticmethod
    def with_owed(local: Refund | None, rest: Refund) -> Refund:
        """with_owed adds memory's part of a refund (refund_owed) to the rest's answer (whose
        figures it keeps: Redis's, or memory's when Redis did not answer)."""
        if local is None:
            return rest
        return replace(rest, refunded=rest.refunded + local.refunded)

    def decision_refund(self, d: Decision, n: int) -> Refund | None:
        """decision_refund checks a refund_decision call and answers the refunds that need no
        Redis call: None means "give back to Redis" (RL.REFUND on `d.key`)."""
        positive(n, "quantity")
        if not isinstance(d, Decision):
            raise TypeError("refund_decision() takes a Decision")
        if d.per_key or not d.key:
            raise ValueError(
                "refund_decision needs one key's decision (of a check_all, each of its per_key)"
            )
        if isinstance(d.policy, Lease):
            raise TypeError("a lease is given back with release(), not refund_decision()")
        if self.deny_cache is not None:
            self.deny_cache.forget(d.key)
        if d.blind:  # the failure policy "open" or "closed" charged nothing
            return Refund(0, 0, timedelta(0), degraded=True)
        if self.taken_locally(d):
            assert self.memory is not None
            r = self.memory.refund(d.key, n)
            if r[0]:
                self.counters.add("refunded", r[0])
            return Refund(r[0], r[1], ms_to_timedelta(r[2]), degraded=True)
        return None

    def taken_locally(self, d: Decision) -> bool:
        """taken_locally: `d`'s charge was taken by the failure policy "local"'s memory."""
        return self.memory is not None and d.degraded and not d.blind

    def lost_refund(self, key: str, cause: BaseException | None) -> Refund:
        """lost_refund answers a refund of Redis's charge that Redis did not take: lost (it
        only under-admits), never taken from memory; LimiterUnavailable for "raise"."""
        self.health.answer(None, key, cause)
        return Refund(0, 0, timedelta(0), degraded=True)

    def release_in_memory(self, key: str, token: bytes, r: Release) -> Release:
        """release_in_memory also frees, under "local", a lease the in-memory limiter granted
        during an outage, once Redis has answered a release (Redis never held it)."""
        if self.memory is None or r.degraded:
            return r
        freed = self.memory.release(key, token)[0]
        return replace(r, released=r.released + freed) if freed else r

    def degraded_release(self, key: str, token: bytes, cause: BaseException | None) -> Release:
        """degraded_release answers a release Redis did not take (in memory under "local")."""
        if self.memory is not None:
            r = self.memory.release(key, token)
            return Release(r[0], r[1], ms_to_timedelta(r[2]), degraded=True)
        self.health.answer(None, key, cause)
        return Release(0, 0, timedelta(0), degraded=True)

    def local_limit(self, limit: Limit) -> Limit:
        """local_limit is `limit` as the failure policy "local" enforces it: divided by
        `fleet_size` (rounding down, at least 1)."""
        if self.fleet_size == 1:
            return limit
        got = self._scaled.get(limit)
        if got is None:
            if len(self._scaled) > 10_000:
                self._scaled.clear()
            got = self._scaled[limit] = scaled(limit, self.fleet_size)
        return got

    def decided_locally(self, d: Decision) -> Decision:
        self.counters.add("local")
        self.counters.count_decision(d)
        return d

    def degraded_all(
        self,
        items: list[tuple[str, Limit, int | None, bytes | None]],
        cause: BaseException | None,
        *,
        cost: int = 1,
        peek: bool = False,
        force: bool = False,
    ) -> Decision:
        if self.memory is not None:
            local = [(k, self.local_limit(lim), own, tok) for k, lim, own, tok in items]
            reply = self.memory.check_all(local, cost, peek=peek, force=force)
            d = self.all_decision(reply, local, Mode.FALLBACK, cost, source=Source.LOCAL)
            per = {k: replace(x, degraded=True) for k, x in d.per_key.items()}
            return self.decided_locally(replace(d, degraded=True, per_key=MappingProxyType(per)))
        per = {k: self.health.answer(lim, k, cause) for k, lim, _, _ in items}
        first = next(iter(per.values()))
        d = Decision(
            allowed=first.allowed,
            limit=min(x.limit for x in per.values()),
            remaining=0,
            retry_after=first.retry_after,
            reset_after=first.reset_after,
            degraded=True,
            source=Source.LOCAL,
            per_key=MappingProxyType(per),
            blind=True,
        )
        self.counters.count_decision(d)
        return d

    def decided(self, d: Decision) -> Decision:
        self.health.success()
        self.counters.count_decision(d)
        return d

    def batch_size(self, limit: Limit, cost: int) -> int:
        """batch_size is how many units one batched call takes (0: do not batch)."""
        if self.credits is None or self.batch is None or not batchable(limit):
            return 0
        k = min(self.batch, limit.capacity)
        return k if cost < k else 0

    def from_credit(self, ck: Hashable, limit: Limit, key: str, cost: int) -> Decision | None:
        if self.credits is None:
            return None
        c = self.credits.take(ck, cost, time.monotonic())
        if c is None:
            return None
        d = Decision(
            allowed=True,
            limit=limit.capacity,
            remaining=c.remaining_seen + c.units,
            retry_after=timedelta(0),
            reset_after=timedelta(0),
            source=Source.LOCAL,
            policy=limit,
            key=key,
        )
        self.counters.add("allowed_locally")
        self.counters.count_decision(d)
        return d

    def keep_credit(
        self, ck: Hashable, limit: Limit, key: str, taken: int, cost: int, d: Decision, sent: float
    ) -> tuple[Decision, Credit | None]:
        """keep_credit stores what a batched call took beyond `cost`; returns the decision
        for the caller and a replaced credit to refund (if any)."""
        units = taken - cost
        if units <= 0 or self.credits is None:
            return d, None
        use_until, refund_until = credit_deadlines(
            limit, taken, sent, d.reset_after, self.batch_hold, self.margin
        )
        now = time.monotonic()
        if use_until <= now:
            return d, None  # too close to a window's end: the units lapse with it
        old = self.credits.put(
            ck, Credit(key, limit, units, use_until, refund_until, d.remaining), now
        )
        return (
            Decision(
                allowed=True,
                limit=d.limit,
                remaining=d.remaining + units,
                retry_after=d.retry_after,
                reset_after=d.reset_after,
                source=d.source,
                policy=limit,
                key=key,
            ),
            old,
        )

    def first_take(self, ck: Hashable, limit: Limit, cost: int, k: int) -> int:
        """first_take is how many units to ask for: `k`, unless the last reply for this key
        (plus what GCRA refilled since) says fewer are there, so that a key running at its
        limit costs one call per admission, not two."""
        hint = self._hints.get(ck)
        if hint is None:
            return k
        remaining, at = hint
        elapsed = time.monotonic() - at
        if isinstance(limit, GCRA):
            remaining += int(elapsed * 1e9 / limit.emission_interval_ns)
        elif elapsed > self.batch_hold:
            return k
        return max(cost, min(k, remaining))

    def note_remaining(self, ck: Hashable, remaining: int) -> None:
        if len(self._hints) > 10_000:
            self._hints.clear()
        self._hints[ck] = (remaining, time.monotonic())

    @staticmethod
    def denial_for_cost(limit: Limit, d: Decision, taken: int, cost: int) -> Decision | None:
        """denial_for_cost derives, from Redis's denial of a batch of `taken` units, its
        answer for `cost` units without a second call, where the algorithm allows: GCRA
        (the wait shrinks by (taken − cost)·T) and FIXED (the wait is the window's end for
        any quantity). None: ask Redis (SLIDING, or `cost` might pass now).

        The returned wait is rounded up (a caller who waits it is admitted); the caller
        caches it from 1 ms earlier (the reply's rounding), so the cache never outlasts
        Redis's own denial.
        """
        if d.allowed or d.never or d.remaining >= cost or not isinstance(d.retry_after, timedelta):
            return None
        retry_us = d.retry_after // timedelta(microseconds=1)
        if isinstance(limit, GCRA):
            retry_us -= (taken - cost) * limit.emission_interval_ns // 1000
            if retry_us <= 1000:
                return None
            retry_us = -(-retry_us // 1000) * 1000
        elif not (isinstance(limit, Window) and limit.algorithm is Algorithm.FIXED):
            return None
        return Decision(
            allowed=False,
            limit=d.limit,
            remaining=d.remaining,
            retry_after=timedelta(microseconds=retry_us),
            reset_after=d.reset_after,
            source=d.source,
            policy=limit,
            key=d.key,
        )

    def knows_denied(self, limits: Mapping[str, LimitEntry], cost: int = 1) -> bool:
        """knows_denied says whether the local deny cache denies this call right now (a
        `check` when `limits` holds one key, a `check_all` otherwise), without a Redis call
        and without counting anything."""
        if self.deny_cache is None:
            return False
        items = self.all_items(limits, None)
        if len(items) == 1:
            key, lim, own, _ = items[0]
            ck: Hashable = (key, lim)
            n = cost if own is None else own
        else:
            ck, n = self.all_cache_key(items, cost), cost
        return self.deny_cache.lookup(ck, n, time.monotonic()) is not None

    # -- check_all ----------------------------------------------------------------------------

    def all_items(
        self,
        limits: Mapping[str, LimitEntry],
        tokens: Mapping[str, str | bytes] | None,
    ) -> list[tuple[str, Limit, int | None, bytes | None]]:
        if not limits:
            raise ValueError("check_all needs at least one limit")
        items: list[tuple[str, Limit, int | None, bytes | None]] = []
        for key, entry in limits.items():
            limit, own = (entry if isinstance(entry, tuple) else (entry, None))
            token = None
            if isinstance(limit, Lease):
                raw = (tokens or {}).get(key)
                token = check_token(raw) if raw is not None else None
            items.append((self.full_key(key), limit, own, token))
        return items

    def all_args(
        self,
        items: list[tuple[str, Limit, int | None, bytes | None]],
        cost: int,
        peek: bool,
        force: bool,
    ) -> list[Arg]:
        return all_command(items, cost=cost, peek=peek, force=force)

    @staticmethod
    def all_cache_key(
        items: list[tuple[str, Limit, int | None, bytes | None]], cost: int
    ) -> Hashable:
        return ("ALL", tuple((k, lim, own, tok) for k, lim, own, tok in items), cost)

    @staticmethod
    def all_decision(
        reply: Any,
        items: list[tuple[str, Limit, int | None, bytes | None]],
        mode: Mode,
        cost: int,
        source: Source | None = None,
    ) -> Decision:
        combined = ints(reply[0])
        src = source or source_of(mode)
        per = {
            key: decision_from_reply(ints(r), policy=lim, key=key, source=src)
            for (key, lim, _, _), r in zip(items, reply[1])
        }
        # The binding limit (SPEC: the charged limit admitting the fewest further calls of
        # this shape, ties to the smaller remaining) is the one whose limit and remaining
        # the combined reply carries; among look-alikes, a charged limit (COST ≠ 0) first.
        binding: Limit | None = None
        best: tuple[int, int, int] | None = None
        for (key, lim, own, _), d in zip(items, per.values()):
            if (d.limit, d.remaining) != (combined[1], combined[2]):
                continue
            charge = cost if own is None else own
            rank = (0 if charge > 0 else 1, d.remaining // charge if charge > 0 else 0, d.remaining)
            if best is None or rank < best:
                best, binding = rank, lim
        top = decision_from_reply(combined, policy=binding, key=None, source=src)
        return Decision(
            allowed=top.allowed,
            limit=top.limit,
            remaining=top.remaining,
            retry_after=top.retry_after,
            reset_after=top.reset_after,
            source=src,
            policy=binding,
            per_key=MappingProxyType(per),
        )
