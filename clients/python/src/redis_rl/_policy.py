"""Failure policy, counters and the health state that logs once per burst of failures."""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import redis.exceptions as rexc

from ._decision import Decision, Source
from ._limits import Limit

__all__ = [
    "Counters",
    "FailurePolicy",
    "LimiterError",
    "LeaseLost",
    "LimiterUnavailable",
    "RateLimitExceeded",
    "is_connection_level",
    "is_unavailable",
]

log = logging.getLogger("redis_rl")


class FailurePolicy(str, enum.Enum):
    """FailurePolicy says what a check answers when Redis does not.

    * OPEN: allow, with `degraded=True` (for limits that protect cost or fairness).
    * CLOSED: deny with a short `retry_after`, `degraded=True` (for limits that protect
      security: logins, one-time codes).
    * RAISE: raise LimiterUnavailable and let the application decide.
    * LOCAL: decide in process memory with the same algorithms (and, with a limiter's
      `fleet_size`, each limit divided by the number of processes), `degraded=True`,
      `source=LOCAL`, real numbers in the RateLimit fields; back to Redis when it answers
      (docs/clients.md#failure-policy-local).
    """

    OPEN = "open"
    CLOSED = "closed"
    RAISE = "raise"
    LOCAL = "local"


class LimiterError(Exception):
    """LimiterError is the base of the errors this package raises itself."""


class LimiterUnavailable(LimiterError):
    """LimiterUnavailable: Redis did not answer (policy RAISE). The cause is chained."""


class RateLimitExceeded(LimiterError):
    """RateLimitExceeded is raised by `acquire` when the lease is denied; holds the Decision."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(
            f"rate limit exceeded (retry after {decision.retry_after!r})"
            if not decision.never
            else "request can never pass: it asks for more than the limit"
        )
        self.decision = decision


class LeaseLost(LimiterError):
    """LeaseLost is raised when the `with` / `async with` block of a lease ends after the
    lease was lost (Redis answered LEASELOST to a renewal, or no renewal reached it for a whole
    lease time): the work in the block may have run without its slot. `key` and `token` name
    the lease; `reason` says how it was found lost."""

    def __init__(self, key: str, token: bytes, reason: str) -> None:
        super().__init__(f"the lease on {key!r} was lost while the block ran: {reason}")
        self.key = key
        self.token = token
        self.reason = reason


# Errors that mean "Redis is not answering this request" rather than "the request is wrong":
# the failure policy answers them. Other ResponseErrors (bad arguments, WRONGTYPE) are raised.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.OutOfMemoryError,
    rexc.ReadOnlyError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.SlotNotCoveredError,
    rexc.ClusterError,
    asyncio.TimeoutError,
    TimeoutError,
    ConnectionError,
)


# Connection errors that are not about the link: a refused login or permission, a server
# still loading its data, a full pool. Retrying them at once changes nothing.
_NOT_THE_LINK: tuple[type[BaseException], ...] = (
    rexc.AuthenticationError,
    rexc.AuthorizationError,
    rexc.BusyLoadingError,
    rexc.MaxConnectionsError,
    getattr(rexc, "ExternalAuthProviderError", rexc.AuthenticationError),
)


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):  # redis-py raises its ConnectionError while handling the OSError
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_connection_level(exc: BaseException) -> bool:
    """is_connection_level: a connection that was there failed, not the command or the
    server: reset, aborted, a broken pipe, an end of file ("Connection closed by server"), as
    a pooled connection that a Redis restart closed answers. Not a refused connect (redis-py
    has just tried a fresh connection: nothing is listening, and trying again at once gains
    nothing) and never a timeout (the server may be working on the command, and waiting
    twice makes an outage slow to detect)."""
    if isinstance(exc, (rexc.TimeoutError, TimeoutError, asyncio.TimeoutError, *_NOT_THE_LINK)):
        return False
    return isinstance(exc, (rexc.ConnectionError, ConnectionError)) and not _refused(exc)


def is_unavailable(exc: BaseException) -> bool:
    """is_unavailable tells a Redis outage (connect, timeout, OOM, failover) from misuse."""
    if isinstance(exc, _UNAVAILABLE):
        return True
    if isinstance(exc, rexc.RedisClusterException):
        # "cannot be connected", not "keys must map to the same key slot" (a misuse).
        return "connect" in str(exc).lower()
    if isinstance(exc, rexc.ResponseError):
        msg = str(exc)
        return msg.startswith(("OOM", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY"))
    return False


#: The counter names, in the order `Counters.snapshot()` lists them.
COUNTER_NAMES = (
    "allowed",
    "denied",
    "allowed_locally",
    "denied_locally",
    "degraded",
    "errors",
    "redis_calls",
    "refunded",
    "local",
    "skipped",
    "missing_denied",
    "leases_lost",
    "forwarded_unusable",
    "peer_unknown",
)


class Counters:
    """Counters counts decisions and Redis calls; thread-safe, readable at any time.

    * allowed / denied: every decision returned (local and degraded ones included).
    * allowed_locally: admitted from a batch credit, without a Redis call.
    * denied_locally: denied by the deny cache, without a Redis call.
    * degraded: answered by the failure policy.
    * errors: Redis calls that failed (connect, timeout, OOM, failover), and reported costs
      a middleware could not record in full (beyond the limit's arithmetic: the most it
      holds was recorded).
    * redis_calls: Redis calls made (one per round trip).
    * refunded: units given back (refund() and batch leftovers). A background refund of
      batch leftovers is counted as it is sent, so this never lags what Redis shows.
    * local: decisions made in memory by the failure policy "local" (also counted as
      degraded).
    * skipped: limits a middleware did not apply because the request had no identity for
      them and the rule says `missing="skip"`.
    * missing_denied: requests a middleware answered 401 because a limit's identity was
      missing and the rule says `missing="deny"`.
    * leases_lost: held leases found lost (LEASELOST, or not renewed for a whole lease time).
    * forwarded_unusable: requests from a trusted proxy whose forwarding header held no
      usable address, keyed by the peer address instead.
    * peer_unknown: requests a middleware keyed by the client IP without a usable client
      address (no peer, a peer that is not an IP address, a Unix socket without a trusted
      forwarding header): they share the one bucket `ip:unknown`.

    `hook(name, n)` is called for every increment (for a metrics library); it must be cheap
    and must not raise.
    """

    def __init__(self, hook: Callable[[str, int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTER_NAMES, 0)
        self.hook = hook

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] += n
        if self.hook is not None:
            self.hook(name, n)

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        """snapshot gives a copy of every counter."""
        with self._lock:
            return dict(self._values)

    def count_decision(self, d: Decision) -> None:
        self.add("allowed" if d.allowed else "denied")
        if d.degraded:
            self.add("degraded")


@dataclass
class _Outage:
    started: float
    failures: int
    next_probe: float


class Health:
    """Health tracks Redis failures: one log line per burst, a probe interval, recovery.

    While Redis is failing, calls within `probe_interval` of the last failure are answered
    by the policy without waiting on Redis; the first call after it tries Redis again. The
    first success after a failure logs one recovery line.
    """

    def __init__(
        self,
        policy: FailurePolicy,
        counters: Counters,
        probe_interval: float,
        closed_retry_after: timedelta,
        logger: logging.Logger,
    ) -> None:
        self.policy = policy
        self.counters = counters
        self.probe_interval = probe_interval
        self.closed_retry_after = closed_retry_after
        self.logger = logger
        self._lock = threading.Lock()
        self._outage: _Outage | None = None

    @property
    def failing(self) -> bool:
        """failing is True between a failure and the next success."""
        return self._outage is not None

    def skip(self) -> bool:
        """skip says whether to answer by policy without trying Redis (inside the interval)."""
        outage = self._outage
        if outage is None:
            return False
        now = time.monotonic()
        with self._lock:
            if now < outage.next_probe:
                return True
            outage.next_probe = now + self.probe_interval  # this caller probes
            return False

    def success(self) -> None:
        if self._outage is None:
            return
        with self._lock:
            outage, self._outage = self._outage, None
        if outage is not None:
            self.logger.warning(
                "redis-rl: Redis answers again after %d failed call(s) over %.1f s; "
                "decisions come from Redis again",
                outage.failures,
                time.monotonic() - outage.started,
            )

    def failure(self, exc: BaseException) -> None:
        self.counters.add("errors")
        now = time.monotonic()
        with self._lock:
            first = self._outage is None
            if self._outage is None:
                self._outage = _Outage(now, 1, now + self.probe_interval)
            else:
                self._outage.failures += 1
                self._outage.next_probe = now + self.probe_interval
        if first:
            self.logger.warning(
                "redis-rl: Redis unavailable (%s: %s); policy %s until it answers "
                "(logged once per outage)",
                type(exc).__name__,
                exc,
                self.policy.value,
            )

    def answer(
        self, policy_limit: Limit | None, key: str | None, cause: BaseException | None
    ) -> Decision:
        """answer gives the policy's decision (or raises for RAISE)."""
        if self.policy is FailurePolicy.RAISE:
            raise LimiterUnavailable(
                f"Redis unavailable: {cause}"
                if cause is not None
                else "Redis unavailable (not tried inside the outage's probe interval)"
            ) from cause
        cap = policy_limit.capacity if policy_limit is not None else 0
        if self.policy is FailurePolicy.OPEN:
            return Decision(
                allowed=True,
                limit=cap,
                remaining=0,
                retry_after=timedelta(0),
                reset_after=timedelta(0),
                degraded=True,
                source=Source.LOCAL,
                policy=policy_limit,
                key=key,
                blind=True,
            )
        return Decision(
            allowed=False,
            limit=cap,
            remaining=0,
            retry_after=self.closed_retry_after,
            reset_after=self.closed_retry_after,
            degraded=True,
            source=Source.LOCAL,
            policy=policy_limit,
            key=key,
            blind=True,
        )
