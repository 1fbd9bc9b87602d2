"""The local fast path: the deny cache and batch credits. Pure bookkeeping, no I/O.

Times are `time.monotonic()` seconds. The rules that keep the fast path from admitting what
Redis would deny:

* Deny cache. After Redis denies `cost` units of (key, limit) with `retry_after = r`, a
  request of the same limit for at least `cost` units is denied locally until
  `sent + r`, where `sent` is when the denied request was *sent* (Redis decided at or after
  that instant, so the local deadline is never later than Redis's). It only ever denies.
* Batch credits. A credit is units already paid for in Redis (one `QUANTITY k` call) and
  handed out locally. Window credits are used and refunded only inside the window they were
  paid in (a unit paid in one window must not be used or given back in the next, or that
  window would admit more than its limit); GCRA leftovers are refunded only while the bucket
  cannot have drained past them (before `sent + k·T`), so a refund never gives back more than
  was really unused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import timedelta

from ._decision import Decision, Source
from ._limits import GCRA, Algorithm, Limit, Window

__all__ = ["Credit", "Credits", "DenyCache", "batchable", "credit_deadlines"]


#: The longest timedelta, in microseconds (a local answer saturates there).
_MAX_US = timedelta.max // timedelta(microseconds=1)


@dataclass
class _Denial:
    until: float
    reset_until: float
    cost: int
    decision: Decision


class DenyCache:
    """DenyCache answers denied keys locally until their retry_after runs out."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self._entries: OrderedDict[Hashable, _Denial] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def lookup(self, ck: Hashable, cost: int, now: float) -> Decision | None:
        """lookup gives a local denial for `cost` units of `ck` at `now`, or None."""
        with self._lock:
            entry = self._entries.get(ck)
            if entry is None:
                return None
            if now >= entry.until:
                del self._entries[ck]
                return None
            if cost < entry.cost:
                return None  # a smaller request may pass sooner: ask Redis
            d = entry.decision
        retry_us = min(_MAX_US, max(1000, -(-int((entry.until - now) * 1_000_000) // 1000) * 1000))
        reset_us = min(_MAX_US, max(0, int((entry.reset_until - now) * 1_000_000)))
        return Decision(
            allowed=False,
            limit=d.limit,
            remaining=0,
            retry_after=timedelta(microseconds=retry_us),
            reset_after=timedelta(microseconds=max(reset_us, retry_us)),
            source=Source.LOCAL,
            policy=d.policy,
            key=d.key,
            per_key=d.per_key,
        )

    def store(self, ck: Hashable, cost: int, decision: Decision, sent: float) -> None:
        """store remembers a retryable denial decided no earlier than `sent`."""
        retry = decision.retry_after
        if decision.allowed or not isinstance(retry, timedelta) or decision.degraded:
            return
        until = sent + retry.total_seconds()
        with self._lock:
            self._entries[ck] = _Denial(
                until, sent + decision.reset_after.total_seconds(), cost, decision
            )
            self._entries.move_to_end(ck)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def forget(self, key: str) -> None:
        """forget drops every entry that involves `key` (after a local refund)."""
        with self._lock:
            for ck in [ck for ck in self._entries if _involves(ck, key)]:
                del self._entries[ck]

    def __len__(self) -> int:
        return len(self._entries)


def _involves(ck: Hashable, key: str) -> bool:
    if isinstance(ck, tuple):
        return any(part == key or _involves(part, key) for part in ck)
    return ck == key


@dataclass
class Credit:
    """Credit is units paid for in Redis and not yet handed out."""

    key: str
    limit: Limit
    units: int
    use_until: float
    refund_until: float
    remaining_seen: int


def batchable(limit: Limit) -> bool:
    """batchable: GCRA, FIXED and SLIDING windows (LOG refunds the newest entries, not
    ours, and leases are not counted requests)."""
    return isinstance(limit, GCRA) or (
        isinstance(limit, Window) and limit.algorithm is not Algorithm.LOG
    )


def credit_deadlines(
    limit: Limit, taken: int, sent: float, reset_after: timedelta, hold: float, margin: float
) -> tuple[float, float]:
    """credit_deadlines gives (use_until, refund_until) for `taken` units paid at `sent`.

    GCRA: use within the hold; refund only before `sent + taken·T − margin`.
    FIXED: the window ends `reset_after` after Redis decided (≥ sent).
    SLIDING: after a write the key is idle at the end of the *next* window, so the current
    one ends `reset_after − window` after Redis decided.
    """
    if isinstance(limit, GCRA):
        refund_until = sent + taken * limit.emission_interval_ns / 1e9 - margin
        return sent + hold, refund_until
    assert isinstance(limit, Window)
    end = reset_after.total_seconds()
    if limit.algorithm is Algorithm.SLIDING:
        end -= limit.window_ns / 1e9
    boundary = sent + end - margin
    return min(sent + hold, boundary), boundary


class Credits:
    """Credits holds the batch credits of one limiter, keyed like the deny cache."""

    def __init__(self) -> None:
        self._credits: dict[Hashable, Credit] = {}
        self._lock = threading.Lock()

    def take(self, ck: Hashable, cost: int, now: float) -> Credit | None:
        """take hands out `cost` units from a live credit; returns it (after) or None.

        A credit past its use time is removed and left for `expired()` to refund.
        """
        with self._lock:
            credit = self._credits.get(ck)
            if credit is None or now >= credit.use_until or credit.units < cost:
                return None
            credit.units -= cost
            return credit

    def put(self, ck: Hashable, credit: Credit, now: float) -> Credit | None:
        """put stores a new credit. A live one it meets (another thread's or task's batch of
        the same key and limit, taken at about the same time) is merged into it with the
        earlier of the two deadlines each (before both, both sets of units may be used and
        refunded), so that its units stay usable; returns one past its use time that still
        holds units (to refund)."""
        with self._lock:
            old = self._credits.get(ck)
            self._credits[ck] = credit
            if old is None or old.units <= 0:
                return None
            if now < old.use_until:
                credit.units += old.units
                credit.remaining_seen = min(credit.remaining_seen, old.remaining_seen)
                credit.use_until = min(credit.use_until, old.use_until)
                credit.refund_until = min(credit.refund_until, old.refund_until)
                return None
            return old

    def expired(self, now: float) -> list[Credit]:
        """expired removes and returns credits past their use time that still hold units."""
        out: list[Credit] = []
        with self._lock:
            for ck in [ck for ck, c in self._credits.items() if now >= c.use_until]:
                c = self._credits.pop(ck)
                if c.units > 0:
                    out.append(c)
        return out

    def drain(self) -> list[Credit]:
        """drain removes and returns every credit holding units (on close)."""
        with self._lock:
            out = [c for c in self._credits.values() if c.units > 0]
            self._credits.clear()
        return out

    def __len__(self) -> int:
        return len(self._credits)
