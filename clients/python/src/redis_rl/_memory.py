"""The limits in process memory, for the failure policy "local" (docs/clients.md#failure-policy-local).

While Redis is unreachable a limiter with `on_error="local"` decides in memory with the same
algorithms as the module, in the same integer arithmetic (nanoseconds, no floats), following
the rules of docs/reference.md and the core's src/algo/*.rs line for line:

* GCRA: docs/reference.md#r-gcra-2 (and R-PARAM-2's conversion on a new emission interval,
  R-MAXWAIT-1 reservations, R-FORCE-1, R-REFUND-1);
* FIXED and SLIDING: docs/reference.md#r-fixed-1, #r-sliding-1 (epoch-aligned windows, the
  weighted estimate computed exactly, R-CLOCK-1's "judged at the last write");
* LOG: docs/reference.md#r-log-1 (exact, retry until the request the denial waits for leaves);
* LEASE: docs/reference.md#r-lease-2 (renewal by token, RENEW's LEASELOST);
* RL.ALL's all-or-nothing and its combined reply: docs/reference.md#r-all-1, #r-cost-3.

`MemoryStore` answers with the module's reply shapes (five integers; RL.ALL's pair; RL.REFUND's
and RL.RELEASE's three), so the limiter reads them with the code that reads Redis's replies.
A key whose state is idle (its `reset_after` passed) is gone, as an expired Redis key is. The
clock is the host's (`time.time_ns()`, read once per call at microsecond resolution, like the
module's). One difference by design: a key is kept per algorithm, so a key used with two
algorithms is two keys here (Redis refuses the second one; the calls that reach this store
were valid ones).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

import redis

from ._limits import GCRA, U64_MAX, Algorithm, Lease, Limit, Window

__all__ = ["MemoryStore"]

_I63 = 2**63 - 1
_NS_PER_MS = 1_000_000

FORCE_WITH_LOG = (
    "FORCE cannot be used with LOG: a LOG records each admitted request and never holds more "
    "than its limit; use FIXED or SLIDING to record usage after the fact"
)
FORCE_ON_LEASE = (
    "FORCE cannot be used on a LEASE limit: its slots are taken with RL.LEASE and given back "
    "with RL.RELEASE"
)
OVERFLOW = (
    "arithmetic overflow: QUANTITY, period and rate would move the key's time past 64-bit "
    "nanoseconds"
)


class _Overflow(Exception):
    pass


# -- verdicts and replies ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Decision:
    kind: str  # "allowed" | "reserved" | "denied" | "never"
    wait: int  # ns: the reservation's delay or the denial's retry_after
    limit: int
    remaining: int
    reset: int  # ns

    @property
    def allowed(self) -> bool:
        return self.kind in ("allowed", "reserved")


def _ceil_ms(ns: int) -> int:
    return -(-ns // _NS_PER_MS)


def _i(n: int) -> int:
    return min(n, _I63)


def _five(d: _Decision) -> list[int]:
    """_five is the module's reply (commands/mod.rs `five`)."""
    if d.kind == "denied":
        retry = _i(max(1, _ceil_ms(d.wait)))
    elif d.kind == "reserved":
        retry = _i(_ceil_ms(d.wait))
    else:
        retry = -1
    return [1 if d.allowed else 0, _i(d.limit), _i(d.remaining), retry, _i(_ceil_ms(d.reset))]


def _since(a: int, b: int) -> int:
    """_since is a − b, not below zero (a saturating span)."""
    return a - b if a > b else 0


def _floor_to(t: int, w: int) -> int:
    return t - t % w


def _combine(decisions: Sequence[tuple[_Decision, int]]) -> _Decision:
    """_combine is RL.ALL's combined decision (decision.rs `combine`)."""
    any_charged = any(c > 0 for _, c in decisions)
    taking = [(d, c) for d, c in decisions if c > 0 or not any_charged]
    binding: _Decision | None = None
    best: tuple[int, int, int] | None = None
    for i, (d, c) in enumerate(taking):
        rank = (d.remaining // c if c > 0 else d.remaining, d.remaining, i)
        if best is None or rank < best:
            best, binding = rank, d
    if all(d.allowed for d, _ in taking):
        kind, wait = "allowed", 0
    elif any(d.kind == "never" for d, _ in taking):
        kind, wait = "never", 0
    else:
        kind = "denied"
        wait = max((d.wait for d, _ in taking if d.kind == "denied"), default=1)
    return _Decision(
        kind, wait,
        binding.limit if binding else 0,
        binding.remaining if binding else 0,
        max((d.reset for d, _ in taking), default=0),
    )


# -- GCRA (src/algo/gcra.rs) ----------------------------------------------------------------


@dataclass(frozen=True)
class _Gcra:
    tat: int
    interval: int
    burst: int
    updated: int


def _gcra_effective_tat(interval: int, s: _Gcra | None, now: int) -> int:
    if s is None or s.tat <= now:
        return now
    if s.interval == interval:
        return s.tat
    written = min(s.updated, s.tat)
    in_use = s.tat - written
    converted = -(-(in_use * interval) // max(1, s.interval))
    return max(min(written + converted, U64_MAX), now)


def _gcra_report(burst: int, interval: int, kind: str, wait: int, tat: int, now: int) -> _Decision:
    in_use = _since(tat, now)
    return _Decision(kind, wait, burst, _since(burst * interval, in_use) // interval, in_use)


def _gcra_decide(
    burst: int, t: int, s: _Gcra | None, now: int, n: int, max_wait: int | None
) -> tuple[_Decision, _Gcra | None]:
    tat = _gcra_effective_tat(t, s, now)
    admitted = "reserved" if max_wait is not None else "allowed"
    if n == 0:
        return _gcra_report(burst, t, admitted, 0, tat, now), None
    if n > burst:
        return _gcra_report(burst, t, "never", 0, tat, now), None
    new_tat = tat + n * t
    ahead = new_tat - now
    tolerance = burst * t

    def admit(kind: str, delay: int) -> tuple[_Decision, _Gcra]:
        if new_tat > U64_MAX:
            raise _Overflow
        arrives = min(now + delay, new_tat) if kind == "reserved" else now
        return _gcra_report(burst, t, kind, delay, new_tat, now), _Gcra(new_tat, t, burst, arrives)

    if ahead <= tolerance:
        return admit(admitted, 0)
    wait = min(ahead - tolerance, U64_MAX)
    if max_wait is not None and wait <= max_wait:
        return admit("reserved", wait)
    return _gcra_report(burst, t, "denied", wait, tat, now), None


def _gcra_force(burst: int, t: int, s: _Gcra | None, now: int, n: int) -> tuple[_Decision, _Gcra | None]:
    if n == 0:
        return _gcra_decide(burst, t, s, now, 0, None)
    cost = t * n
    tat = _gcra_effective_tat(t, s, now) + cost
    if cost > U64_MAX or tat > U64_MAX:
        raise _Overflow
    return _gcra_report(burst, t, "allowed", 0, tat, now), _Gcra(tat, t, burst, now)


def _gcra_refund(s: _Gcra, now: int, q: int) -> tuple[_Gcra | None, int]:
    t = max(1, s.interval)
    in_use = _since(s.tat, now)
    refunded = min(q, -(-in_use // t))
    back = q * t
    tat = s.tat - back if back < in_use else now
    if tat <= now:
        return None, refunded
    return replace(s, tat=tat, updated=min(s.updated, tat)), refunded


# -- FIXED (src/algo/fixed_window.rs) --------------------------------------------------------


@dataclass(frozen=True)
class _Fixed:
    window: int
    limit: int
    window_start: int
    count: int
    updated: int


def _fixed_count(s: _Fixed | None, window_start: int) -> int:
    return s.count if s is not None and s.updated >= window_start else 0


def _fixed_decide(
    limit: int, window: int, s: _Fixed | None, now: int, n: int, force: bool
) -> tuple[_Decision, _Fixed | None]:
    at = max(now, s.updated) if s is not None else now
    start = _floor_to(at, window)
    end = start + window
    if end > U64_MAX:
        raise _Overflow
    to_end = _since(end, now)
    count = _fixed_count(s, start)

    def report(kind: str, wait: int, after: int) -> _Decision:
        return _Decision(kind, wait, limit, _since(limit, after), to_end if after > 0 else 0)

    if n == 0:
        return report("allowed", 0, count), None
    if force:
        after = count + n
        if after > U64_MAX:
            raise _Overflow
        return (_Decision("allowed", 0, limit, _since(limit, after), to_end),
                _Fixed(window, limit, start, after, at))
    if n > limit:
        return report("never", 0, count), None
    if count > limit - n:
        return report("denied", to_end, count), None
    return report("allowed", 0, count + n), _Fixed(window, limit, start, count + n, at)


def _fixed_refund(s: _Fixed, now: int, q: int) -> tuple[_Fixed | None, int]:
    start = _floor_to(max(now, s.updated), s.window)
    count = _fixed_count(s, start)
    refunded = min(q, count)
    left = count - refunded
    return (replace(s, count=left) if left else None), refunded


# -- SLIDING (src/algo/sliding_window.rs) ----------------------------------------------------


@dataclass(frozen=True)
class _Sliding:
    window: int
    limit: int
    window_start: int
    prev: int
    curr: int
    updated: int


def _sliding_counts(s: _Sliding | None, now: int, window: int) -> tuple[int, int]:
    if s is None:
        return 0, 0
    start = _floor_to(now, window)
    prev_start = _since(start, window)
    prev = curr = 0

    def place(last: int, n: int) -> None:
        nonlocal prev, curr
        if n == 0:
            pass
        elif last >= start:
            curr = min(curr + n, U64_MAX)
        elif last >= prev_start and start > 0:
            prev = min(prev + n, U64_MAX)

    place(max(s.updated, s.window_start), s.curr)
    if s.window_start >= 1:
        place(s.window_start - 1, s.prev)
    return prev, curr


def _scaled_estimate(prev: int, curr: int, elapsed: int, window: int) -> int:
    return prev * _since(window, elapsed) + curr * window


def _earliest_offset(prev: int, room: int, start_from: int, window: int) -> int | None:
    if prev == 0:
        return start_from
    k = room * window // prev
    if k >= window:
        return start_from
    e = window - k
    return max(e, start_from) if e < window else None


def _sliding_decide(
    limit: int, window: int, s: _Sliding | None, now: int, n: int, force: bool
) -> tuple[_Decision, _Sliding | None]:
    at = max(now, s.updated) if s is not None else now
    start = _floor_to(at, window)
    elapsed = at - start
    end = start + window
    next_end = end + window
    if next_end > U64_MAX:
        raise _Overflow
    prev, curr = _sliding_counts(s, at, window)
    limit_scaled = limit * window

    def report(kind: str, wait: int, p: int, c: int) -> _Decision:
        est = _scaled_estimate(p, c, elapsed, window)
        remaining = min(_since(limit_scaled, est) // window, U64_MAX)
        if c > 0:
            reset = _since(next_end, now)
        elif p > 0:
            reset = _since(end, now)
        else:
            reset = 0
        return _Decision(kind, wait, limit, remaining, reset)

    if n == 0:
        return report("allowed", 0, prev, curr), None
    if force:
        after = curr + n
        if after > U64_MAX:
            raise _Overflow
        d = report("allowed", 0, prev, after)
        return (replace(d, reset=_since(next_end, now)),
                _Sliding(window, limit, start, prev, after, at))
    if n > limit:
        return report("never", 0, prev, curr), None
    if _scaled_estimate(prev, curr, elapsed, window) + n * window <= limit_scaled:
        after = curr + n
        if after > U64_MAX:
            raise _Overflow
        return report("allowed", 0, prev, after), _Sliding(window, limit, start, prev, after, at)
    room_now = limit - (curr + n)
    offset = _earliest_offset(prev, room_now, elapsed, window) if room_now >= 0 else None
    if offset is not None:
        admits_at = min(start + offset, U64_MAX)
    else:
        nxt = _earliest_offset(curr, limit - n, 0, window)
        admits_at = min(end + nxt, U64_MAX) if nxt is not None else next_end
    return report("denied", max(1, _since(admits_at, now)), prev, curr), None


def _sliding_refund(s: _Sliding, now: int, q: int) -> tuple[_Sliding | None, int]:
    at = max(now, s.updated)
    start = _floor_to(at, s.window)
    prev, curr = _sliding_counts(s, at, s.window)
    refunded = min(q, curr)
    curr -= refunded
    if curr == 0 and prev == 0:
        return None, refunded
    updated = max(s.updated, start) if curr > 0 else start
    return replace(s, window_start=start, prev=prev, curr=curr, updated=updated), refunded


# -- LOG (src/algo/sliding_log.rs) -----------------------------------------------------------


@dataclass
class _Log:
    window: int
    limit: int
    entries: list[list[int]] = field(default_factory=list)  # [instant, count], oldest first

    def count_after(self, cutoff: int | None) -> int:
        return sum(c for t, c in self.entries if cutoff is None or t > cutoff)

    def nth_after(self, cutoff: int | None, n: int) -> int | None:
        seen = 0
        for t, c in self.entries:
            if cutoff is not None and t <= cutoff:
                continue
            seen += c
            if seen >= n:
                return t
        return None

    def drop_until(self, cutoff: int) -> None:
        self.entries = [e for e in self.entries if e[0] > cutoff]

    def push(self, at: int, count: int) -> None:
        if self.entries and at <= self.entries[-1][0]:
            self.entries[-1][1] += count
        else:
            self.entries.append([at, count])

    def pop_back(self, count: int) -> None:
        while count > 0 and self.entries:
            last = self.entries[-1]
            taken = min(count, last[1])
            last[1] -= taken
            count -= taken
            if last[1] == 0:
                self.entries.pop()


def _log_decide(limit: int, window: int, s: _Log | None, now: int, n: int) -> tuple[_Decision, _Log | None]:
    cutoff = now - window if now >= window else None
    in_window = s.count_after(cutoff) if s is not None else 0
    newest = s.entries[-1][0] if s is not None and s.entries else None
    if newest is not None and cutoff is not None and newest <= cutoff:
        newest = None

    def report(kind: str, wait: int, count: int, last: int | None) -> _Decision:
        if last is not None and last + window > U64_MAX:
            raise _Overflow
        reset = _since(last + window, now) if last is not None else 0
        return _Decision(kind, wait, limit, _since(limit, count), reset)

    if n == 0:
        return report("allowed", 0, in_window, newest), None
    if n > limit:
        return report("never", 0, in_window, newest), None
    after = in_window + n
    if after > U64_MAX:
        raise _Overflow
    if after <= limit:
        written = _Log(window, limit, [list(e) for e in s.entries] if s is not None else [])
        if now >= window:
            written.drop_until(now - window)
        written.push(now, n)
        return report("allowed", 0, after, max(newest, now) if newest is not None else now), written
    need = after - limit
    at = s.nth_after(cutoff, need) if s is not None else None
    if at is not None and at + window > U64_MAX:
        raise _Overflow
    leaves_at = at + window if at is not None else min(now + window, U64_MAX)
    return report("denied", max(1, _since(leaves_at, now)), in_window, newest), None


def _log_refund(s: _Log, now: int, q: int) -> tuple[_Log | None, int]:
    cutoff = now - s.window if now >= s.window else None
    in_window = s.count_after(cutoff)
    refunded = min(q, in_window)
    if refunded == 0:
        return s, 0
    if refunded >= in_window:
        return None, refunded
    after = _Log(s.window, s.limit, [list(e) for e in s.entries])
    if cutoff is not None:
        after.drop_until(cutoff)
    after.pop_back(q)
    return after, refunded


# -- LEASE (src/algo/lease.rs) ---------------------------------------------------------------


@dataclass
class _Leases:
    limit: int
    held: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # token -> (slots, expiry)

    def live(self, now: int) -> dict[bytes, tuple[int, int]]:
        return {t: v for t, v in self.held.items() if v[1] > now}

    def report(self, limit: int, now: int) -> _Decision:
        live = self.live(now)
        last = max((e for _, e in live.values()), default=None)
        return _Decision("allowed", 0, limit, _since(limit, sum(s for s, _ in live.values())),
                         _since(last, now) if last is not None else 0)


def _lease_decide(
    limit: int, lease_ns: int, s: _Leases | None, now: int, token: bytes, n: int
) -> tuple[_Decision, _Leases | None]:
    live = s.live(now) if s is not None else {}
    own = live.get(token)
    others = {t: v for t, v in live.items() if t != token}
    held_others = sum(v[0] for v in others.values())
    held_now = held_others + (own[0] if own else 0)
    last_now = max((v[1] for v in live.values()), default=None)

    def report(kind: str, wait: int, held: int, last: int | None) -> _Decision:
        return _Decision(kind, wait, limit, _since(limit, held), 0 if last is None else _since(last, now))

    if n == 0:
        return report("allowed", 0, held_now, last_now), None
    if n > limit:
        return report("never", 0, held_now, last_now), None
    if held_others <= limit - n:
        expires = now + lease_ns
        if expires > U64_MAX:
            raise _Overflow
        last = max([expires, *(v[1] for v in others.values())])
        written = _Leases(limit, {**others, token: (n, expires)})
        return report("allowed", 0, held_others + n, last), written
    need = held_others - (limit - n)
    frees = None
    for expiry, slots in sorted((v[1], v[0]) for v in others.values()):
        need -= slots
        if need <= 0:
            frees = expiry
            break
    at = frees if frees is not None else min(now + lease_ns, U64_MAX)
    return report("denied", max(1, _since(at, now)), held_now, last_now), None


def _shown(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return text[:64]


# -- the store ------------------------------------------------------------------------------

_State = Union[_Gcra, _Fixed, _Sliding, _Log, _Leases]


def _kind(limit: Limit) -> str:
    if isinstance(limit, GCRA):
        return "G"
    if isinstance(limit, Lease):
        return "E"
    return limit.algorithm.value[0]


class MemoryStore:
    """MemoryStore holds the in-memory limits of one limiter (thread-safe).

    At most `max_keys` keys are kept (the least recently written go first when more are
    made): an outage with very many distinct clients forgets the oldest, never grows without
    bound. `clock` gives nanoseconds since the epoch (default: the host's, at microsecond
    resolution).
    """

    def __init__(
        self, max_keys: int = 100_000, clock: Callable[[], int] | None = None
    ) -> None:
        self.max_keys = max_keys
        self._clock = clock or (lambda: time.time_ns() // 1000 * 1000)
        # (key, kind) -> (state, expiry in ms, owed): owed is the units this store charged the
        # key (checks, FORCE, reservations) and has not been given back yet; a refund after
        # Redis answers again gives them back here, where they were taken (`refund_owed`).
        # It lives as long as the key does (an idle key's state is gone, and its owed count
        # with it).
        self._keys: OrderedDict[tuple[str, str], tuple[_State, int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()

    # -- state access (under the lock) ------------------------------------------------------

    def _load(self, key: str, kind: str, now: int) -> _State | None:
        entry = self._keys.get((key, kind))
        if entry is None:
            return None
        state, expire_at_ms, _ = entry
        if now // _NS_PER_MS > expire_at_ms:  # Redis: expired once its ms clock passes the expiry
            del self._keys[(key, kind)]
            return None
        return state

    def _store(
        self, key: str, kind: str, state: _State | None, now: int, reset: int, charged: int = 0
    ) -> None:
        """_store writes key's state (None: the key is idle, gone); `charged` units are added
        to what the key owes."""
        if state is None:
            self._keys.pop((key, kind), None)
            return
        # The module's expiry: the instant the key is idle, rounded up to the millisecond
        # (docs/reference.md#r-time-4), kept by Redis while its clock's milliseconds do not
        # pass it.
        old = self._keys.get((key, kind))
        owed = min((old[2] if old is not None else 0) + charged, U64_MAX)
        self._keys[(key, kind)] = (state, _ceil_ms(now + reset), owed)
        self._keys.move_to_end((key, kind))
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)

    def _decide(
        self, key: str, limit: Limit, now: int, n: int, *, force: bool, max_wait: int | None,
        token: bytes | None,
    ) -> tuple[_Decision, _State | None]:
        kind = _kind(limit)
        s = self._load(key, kind, now)
        if force and isinstance(limit, Lease):
            raise redis.ResponseError(FORCE_ON_LEASE)
        if force and isinstance(limit, Window) and limit.algorithm is Algorithm.LOG:
            raise redis.ResponseError(FORCE_WITH_LOG)
        try:
            if isinstance(limit, GCRA):
                g = s if isinstance(s, _Gcra) else None
                b, t = limit.burst, limit.emission_interval_ns
                return _gcra_force(b, t, g, now, n) if force else _gcra_decide(b, t, g, now, n, max_wait)
            if isinstance(limit, Lease):
                assert token is not None
                e = s if isinstance(s, _Leases) else None
                return _lease_decide(limit.limit, limit.lease_ns, e, now, token, n)
            lim, w = limit.limit, limit.window_ns
            if limit.algorithm is Algorithm.FIXED:
                return _fixed_decide(lim, w, s if isinstance(s, _Fixed) else None, now, n, force)
            if limit.algorithm is Algorithm.SLIDING:
                return _sliding_decide(lim, w, s if isinstance(s, _Sliding) else None, now, n, force)
            return _log_decide(lim, w, s if isinstance(s, _Log) else None, now, n)
        except _Overflow:
            raise redis.ResponseError(OVERFLOW) from None

    # -- the commands ---------------------------------------------------------------------

    def check(
        self, key: str, limit: Limit, n: int, *, peek: bool = False, force: bool = False,
        max_wait_ms: int | None = None,
    ) -> list[int]:
        """check is RL.GCRA / RL.WINDOW: the five integers."""
        max_wait = None if max_wait_ms is None else min(max_wait_ms * _NS_PER_MS, U64_MAX)
        with self._lock:
            now = self._clock()
            d, write = self._decide(key, limit, now, n, force=force, max_wait=max_wait, token=None)
            if write is not None and not peek and d.allowed:
                self._store(key, _kind(limit), write, now, d.reset, n)
            return _five(d)

    def check_all(
        self,
        items: Sequence[tuple[str, Limit, int | None, bytes | None]],
        cost: int,
        *,
        peek: bool = False,
        force: bool = False,
    ) -> list[object]:
        """check_all is RL.ALL: [combined five, [per-key fives]], all or nothing."""
        with self._lock:
            now = self._clock()
            decided = []
            for key, limit, own, token in items:
                charge = cost if own is None else own
                d, write = self._decide(key, limit, now, charge, force=force, max_wait=None, token=token)
                decided.append((key, limit, charge, d, write))
            if len(decided) == 1:
                combined = decided[0][3]
            else:
                combined = _combine([(d, c) for _, _, c, d, _ in decided])
            may_write = not peek and any(c > 0 for _, _, c, _, _ in decided)
            if may_write and combined.allowed:
                for key, limit, charge, d, write in decided:
                    if write is not None:
                        self._store(key, _kind(limit), write, now, d.reset, charge)
            return [_five(combined), [_five(d) for _, _, _, d, _ in decided]]

    def lease(
        self, key: str, lease: Lease, token: bytes, slots: int, *, peek: bool = False,
        renew: bool = False,
    ) -> list[int]:
        """lease is RL.LEASE (with RENEW: LEASELOST when `token` holds no live lease)."""
        with self._lock:
            now = self._clock()
            if renew:
                s = self._load(key, "E", now)
                if not isinstance(s, _Leases) or token not in s.live(now):
                    raise redis.ResponseError(
                        f"LEASELOST lease '{_shown(token)}' on key '{_shown(key)}' is not held"
                    )
            d, write = self._decide(key, lease, now, slots, force=False, max_wait=None, token=token)
            if write is not None and not peek and d.allowed:
                self._store(key, "E", write, now, d.reset)
            return _five(d)

    def release(self, key: str, token: bytes) -> list[int]:
        """release is RL.RELEASE: [released, remaining, reset_after_ms]."""
        with self._lock:
            now = self._clock()
            s = self._load(key, "E", now)
            if not isinstance(s, _Leases):
                return [0, 0, 0]
            live = s.live(now)
            if token not in live:
                d = s.report(s.limit, now)
                return [0, _i(d.remaining), _i(_ceil_ms(d.reset))]
            slots = live.pop(token)[0]
            after = _Leases(s.limit, live)
            d = after.report(s.limit, now)
            self._store(key, "E", after if live else None, now, d.reset)
            return [_i(slots), _i(d.remaining), _i(_ceil_ms(d.reset))]

    def refund(self, key: str, quantity: int) -> list[int]:
        """refund is RL.REFUND on whichever rate key `key` holds: [refunded, remaining,
        reset_after_ms] ([0, 0, 0] for a key it does not hold)."""
        return self.refund_owed(key, quantity, owed_only=False)[1]

    def refund_owed(self, key: str, quantity: int, *, owed_only: bool) -> tuple[int, list[int]]:
        """refund_owed is `refund` that also settles what the key owes: (taken, reply).

        With `owed_only` it gives back at most the units this store charged the key and has
        not given back (none owed: taken 0 and [0, 0, 0], nothing done), so that a refund of
        charges taken here comes back here and the rest can go to Redis. `taken` is the part
        of `quantity` it answered for (all of it without `owed_only`, once it holds the key;
        0 when it does not hold it)."""
        with self._lock:
            now = self._clock()
            for kind in ("G", "F", "S", "L"):
                s = self._load(key, kind, now)
                if s is None:
                    continue
                _, _, owed = self._keys[(key, kind)]
                take = quantity
                if owed_only:
                    take = min(quantity, owed)
                    if take == 0:
                        continue
                self._keys[(key, kind)] = (s, self._keys[(key, kind)][1], owed - min(take, owed))
                limit, after, refunded = self._refund(s, now, take)
                if refunded == 0:
                    d = self._report(s, now)
                    return take, [0, _i(d.remaining), _i(_ceil_ms(d.reset))]
                if after is None:
                    self._store(key, kind, None, now, 0)
                    return take, [_i(refunded), _i(limit), 0]
                d = self._report(after, now)
                self._store(key, kind, after, now, d.reset)
                return take, [_i(refunded), _i(d.remaining), _i(_ceil_ms(d.reset))]
            return 0, [0, 0, 0]

    @staticmethod
    def _refund(s: _State, now: int, q: int) -> tuple[int, _State | None, int]:
        if isinstance(s, _Gcra):
            after_g, n = _gcra_refund(s, now, q)
            return s.burst, after_g, n
        if isinstance(s, _Fixed):
            after_f, n = _fixed_refund(s, now, q)
            return s.limit, after_f, n
        if isinstance(s, _Sliding):
            after_s, n = _sliding_refund(s, now, q)
            return s.limit, after_s, n
        assert isinstance(s, _Log)
        after_l, n = _log_refund(s, now, q)
        return s.limit, after_l, n

    @staticmethod
    def _report(s: _State, now: int) -> _Decision:
        if isinstance(s, _Gcra):
            return _gcra_decide(s.burst, s.interval, s, now, 0, None)[0]
        if isinstance(s, _Leases):
            return s.report(s.limit, now)
        if isinstance(s, _Fixed):
            return _fixed_decide(s.limit, s.window, s, now, 0, False)[0]
        if isinstance(s, _Sliding):
            return _sliding_decide(s.limit, s.window, s, now, 0, False)[0]
        return _log_decide(s.limit, s.window, s, now, 0)[0]
