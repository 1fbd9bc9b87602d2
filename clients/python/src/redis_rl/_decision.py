"""The Decision a limiter returns, and its HTTP header fields."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Final, Literal, Union

from ._limits import GCRA, Lease, Limit, Window

__all__ = ["NEVER", "Decision", "Never", "RetryAfter", "Source"]


class Never(enum.Enum):
    """Never is the type of NEVER: a request that can never be allowed (cost > limit)."""

    NEVER = "never"

    def __repr__(self) -> str:
        return "NEVER"

    def __bool__(self) -> bool:  # so `if decision.retry_after:` reads "is there a wait"
        return True


#: The retry_after of a request that no wait can admit (its cost exceeds the limit).
NEVER: Final = Never.NEVER

#: A retry_after: a wait, or NEVER.
RetryAfter = Union[timedelta, Literal[Never.NEVER]]


class Source(str, enum.Enum):
    """Source says who answered: the module, the Lua fallback, or the client itself."""

    MODULE = "module"
    FALLBACK = "fallback"
    LOCAL = "local"


_ZERO = timedelta(0)
_EMPTY: Mapping[str, Decision] = MappingProxyType({})


_MAX_MS = timedelta.max // timedelta(milliseconds=1)


def ms_to_timedelta(ms: int) -> timedelta:
    """ms_to_timedelta reads a reply's milliseconds (≥ 0) as a timedelta, saturating at
    `timedelta.max` (about 2.7 million years) rather than raising OverflowError."""
    if ms >= _MAX_MS:
        return timedelta.max
    return timedelta(milliseconds=ms)


def ceil_seconds(d: timedelta) -> int:
    """ceil_seconds rounds a duration up to whole seconds (as Retry-After wants)."""
    us = (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
    return -(-us // 1_000_000)


def _sf_string(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Decision:
    """Decision is the answer to one request.

    * `allowed`: the request may go ahead.
    * `limit`: the most requests an idle key admits at once (burst / limit / slots).
    * `remaining`: requests of cost 1 still allowed right now, after this one (≥ 0).
    * `retry_after`: when denied, how long until this same request would be allowed
      (≥ 1 ms), or NEVER when its cost exceeds the limit; when allowed, the wait before
      acting (zero, except for a reservation made with `max_wait`).
    * `reset_after`: how long until the key is idle again (zero for an idle key).
    * `degraded`: Redis did not answer; this came from the failure policy.
    * `source`: MODULE, FALLBACK (the Lua library) or LOCAL (deny cache, batch credit, or
      failure policy).
    * `blind`: the failure policy answered without counting anything ("open" or "closed"):
      the numbers say nothing about the key, so `headers()` gives no RateLimit fields. False
      for every other decision, including the "local" policy's, which counts in memory and
      whose numbers are real.
    * `policy`: the limit this decision is about (None for a combined decision).
    * `key`: the key, as sent (None for a combined decision).
    * `per_key`: for `check_all`, the per-key decisions in key order.
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after: RetryAfter
    reset_after: timedelta
    degraded: bool = False
    source: Source = Source.MODULE
    policy: Limit | None = None
    key: str | None = None
    per_key: Mapping[str, Decision] = field(default_factory=lambda: _EMPTY)
    blind: bool = False

    @property
    def never(self) -> bool:
        """never is True when the request can never be allowed (HTTP 413, not 429)."""
        return self.retry_after is NEVER

    @property
    def retry_after_seconds(self) -> float | None:
        """retry_after_seconds is retry_after as float seconds (None for NEVER)."""
        if isinstance(self.retry_after, timedelta):
            return self.retry_after.total_seconds()
        return None

    def __bool__(self) -> bool:
        return self.allowed

    def headers(
        self,
        policy_name: str | None = None,
        *,
        names: Mapping[str, str] | None = None,
        x_headers: bool = False,
    ) -> dict[str, str]:
        """headers gives the HTTP response fields for this decision.

        * `Retry-After` (seconds, rounded up, ≥ 1) when denied and retryable.
        * `RateLimit-Policy: "name";q=<limit>;w=<window seconds>` and
          `RateLimit: "name";r=<remaining>;t=<reset seconds>` (IETF
          draft-ietf-httpapi-ratelimit-headers). A combined decision lists every limit,
          in key order, in both fields.
        * with `x_headers=True`: `X-RateLimit-Limit`, `X-RateLimit-Remaining`,
          `X-RateLimit-Reset` (seconds from now) of the binding limit.

        `policy_name` names a single limit (default: the limit's `name`, else "default");
        `names` maps keys to names for a combined decision (default: each limit's `name`,
        else "limit1", "limit2", …). A degraded blind decision (failure policy "open" or
        "closed") carries no RateLimit field, neither RateLimit-Policy nor RateLimit (nothing
        is known about the key: docs/clients.md#closed-policy), only Retry-After when it
        denies; a "local" policy's degraded decision carries the local limiter's numbers.
        """
        out: dict[str, str] = {}
        if not self.allowed and isinstance(self.retry_after, timedelta):
            out["Retry-After"] = str(max(1, ceil_seconds(self.retry_after)))
        items: Sequence[tuple[str, Decision]]
        if self.per_key:
            items = [
                (
                    (names or {}).get(k)
                    or (d.policy.name if d.policy is not None and d.policy.name else None)
                    or f"limit{i + 1}",
                    d,
                )
                for i, (k, d) in enumerate(self.per_key.items())
            ]
        else:
            name = policy_name or (self.policy.name if self.policy and self.policy.name else None)
            items = [(name or "default", self)]
        if self.blind and self.degraded:
            return out  # the failure policy "open" or "closed": no RateLimit field at all
        policies = [d._policy_item(n) for n, d in items]
        policies = [p for p in policies if p]
        if policies:
            out["RateLimit-Policy"] = ", ".join(policies)
        if not self.blind:
            out["RateLimit"] = ", ".join(
                f"{_sf_string(n)};r={d.remaining};t={ceil_seconds(d.reset_after)}"
                for n, d in items
            )
            if x_headers:
                out["X-RateLimit-Limit"] = str(self.limit)
                out["X-RateLimit-Remaining"] = str(self.remaining)
                out["X-RateLimit-Reset"] = str(ceil_seconds(self.reset_after))
        return out

    def _policy_item(self, name: str) -> str:
        if self.policy is None:
            return f"{_sf_string(name)};q={self.limit}" if self.limit else ""
        item = f"{_sf_string(name)};q={self.policy.capacity}"
        if isinstance(self.policy, (GCRA, Window)):
            item += f";w={max(1, ceil_seconds(self.policy.window))}"
        elif isinstance(self.policy, Lease):
            item += ';qu="concurrent-requests"'
        return item


def decision_from_reply(
    reply: Sequence[int],
    *,
    policy: Limit | None,
    key: str | None,
    source: Source,
    reservation: bool = False,
) -> Decision:
    """decision_from_reply reads the five-integer reply into a Decision.

    `-1` becomes a zero wait when allowed, NEVER when denied; with `reservation` (MAXWAIT)
    an allowed reply's retry field is the wait before acting.
    """
    allowed = int(reply[0]) == 1
    retry_ms = int(reply[3])
    retry: RetryAfter
    if allowed:
        retry = ms_to_timedelta(retry_ms) if (reservation and retry_ms > 0) else _ZERO
    elif retry_ms < 0:
        retry = NEVER
    else:
        retry = ms_to_timedelta(retry_ms)
    return Decision(
        allowed=allowed,
        limit=int(reply[1]),
        remaining=max(0, int(reply[2])),
        retry_after=retry,
        reset_after=ms_to_timedelta(max(0, int(reply[4]))),
        source=source,
        policy=policy,
        key=key,
    )
